package correlator

import "github.com/prometheus/client_golang/prometheus"

// Collectors returns the correlator's counters as Prometheus metrics, read
// at scrape time from Stats: events streamed, batches (and replays), starts
// (and duplicates absorbed), replies, parked events, and
// compensa_events_total{outcome} which tells an operator why nothing
// happened (an event no saga listens to is ignored, by design).
func (c *Correlator) Collectors() []prometheus.Collector {
	const namespace = "compensa"
	stat := func(f func(Stats) uint64) func() float64 {
		return func() float64 { return float64(f(c.Stats())) }
	}
	counter := func(name, help string, f func(Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, stat(f))
	}
	outcome := func(outcome string, f func(Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: namespace, Name: "events_total",
			Help:        "Streamed events by what became of them: started (a trigger), reply (went to reply correlation), ignored (no saga listens to it), filtered (a trigger's filter said no), parked (dead letter).",
			ConstLabels: prometheus.Labels{"outcome": outcome}}, stat(f))
	}
	return []prometheus.Collector{
		counter("events_streamed_total", "Outbox events the correlator received from the stream.",
			func(s Stats) uint64 { return s.EventsSeen }),
		counter("batches_total", "Source transactions (batches) the correlator committed, replays included.",
			func(s Stats) uint64 { return s.Batches }),
		counter("batches_replayed_total", "Batches recognised as already handled (a replay after a crash) and skipped.",
			func(s Stats) uint64 { return s.BatchesReplayed }),
		counter("correlator_sagas_started_total", "Saga instances the correlator started, all sagas together.",
			func(s Stats) uint64 { return s.SagasStarted }),
		counter("duplicate_starts_total", "Trigger events that would have started an instance a second time (absorbed by the unique index).",
			func(s Stats) uint64 { return s.DuplicateStarts }),
		counter("replies_delivered_total", "Reply events delivered to waiting steps.",
			func(s Stats) uint64 { return s.RepliesDelivered }),
		counter("late_replies_total", "Reply events that found no step waiting for them.",
			func(s Stats) uint64 { return s.LateReplies }),
		counter("events_parked_total", "Events parked as dead letters by this process.",
			func(s Stats) uint64 { return s.EventsParked }),
		outcome("started", func(s Stats) uint64 { return s.OutcomeStarted }),
		outcome("reply", func(s Stats) uint64 { return s.OutcomeReply }),
		outcome("ignored", func(s Stats) uint64 { return s.OutcomeIgnored }),
		outcome("filtered", func(s Stats) uint64 { return s.OutcomeFiltered }),
		outcome("parked", func(s Stats) uint64 { return s.OutcomeParked }),
	}
}
