package relay

import (
	"cmp"
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/saga/admin"
	"github.com/compensa/compensa/saga/pgjournal"
)

// kept turns a retention of the Config (KeepForever or positive) into the
// janitor's (0 keeps).
func kept(d time.Duration) time.Duration { return max(d, 0) }

// janitorOn reports whether the janitor deletes anything (it compacts the
// status counts in any case).
func (c Config) janitorOn() bool {
	return kept(c.SagaRetention) > 0 || c.FailedRetention > 0 || kept(c.DedupeWindow) > 0
}

// retentionInterval is how often the janitor runs: half the shortest
// retention, between one second and thirty.
func (c Config) retentionInterval() time.Duration {
	shortest := 30 * time.Second
	for _, d := range []time.Duration{kept(c.SagaRetention), c.FailedRetention} {
		if d > 0 {
			shortest = min(shortest, d/2)
		}
	}
	return max(shortest, time.Second)
}

// newRetention builds the janitor with its metrics, registered beside the
// relay's others.
func (r *Relay) newRetention(adm *admin.Admin) (*pgjournal.Retention, error) {
	cfg := r.cfg
	deleted := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "compensa", Name: "retention_deleted_rows_total",
		Help: "Rows the retention janitor deleted, by table (saga_status_deltas: folded into the totals).",
	}, []string{"table"})
	oldest := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "compensa", Name: "retention_oldest_kept_seconds",
		Help: "Age of the oldest row the retention janitor keeps, by table (history tables: the oldest ended instance whose history is kept; saga_instances: the oldest tombstone); set by the relay that runs the janitor.",
	}, []string{"table"})
	for _, c := range []prometheus.Collector{deleted, oldest} {
		if err := r.metrics.Registry().Register(c); err != nil {
			return nil, err
		}
	}
	rc := pgjournal.RetentionConfig{
		History: kept(cfg.SagaRetention), Failed: cfg.FailedRetention, DedupeWindow: kept(cfg.DedupeWindow),
		Interval:      cfg.retentionInterval(),
		CompactCounts: adm.CompactCounts,
		OnDeleted:     func(t string, n int64) { deleted.WithLabelValues(t).Add(float64(n)) },
		OnOldestKept:  func(t string, age time.Duration) { oldest.WithLabelValues(t).Set(age.Seconds()) },
		Logger:        cfg.Logger.With("component", "retention"),
	}
	if cfg.OnSlotLost == cdc.SlotLostResync {
		// A resync re-reads from the checkpoint's time minus the margin:
		// the tombstones of those triggers stay, whatever their age.
		rc.ResyncSlot, rc.ResyncMargin = cfg.Slot, cmp.Or(cfg.ResyncMargin, cdc.DefaultResyncMargin)
	}
	return pgjournal.NewRetention(r.pool, rc)
}

// runRetention runs the janitor until ctx ends.
func (r *Relay) runRetention(ctx context.Context) {
	defer r.wg.Done()
	r.retention.Run(ctx)
}
