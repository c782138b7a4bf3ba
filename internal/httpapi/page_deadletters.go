package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/compensa/compensa/correlator"
	"github.com/compensa/compensa/sink"
)

// readiness is the relay's ready or not-ready state as /readyz answers it,
// shown at the top of the page.
type readiness struct {
	// Known is false when the check could not be run (the visitor left).
	Known   bool
	Ready   bool
	Reasons []string
}

// pageReadiness runs (or reuses, within ReadinessMaxAge) the /readyz check.
func (s *Server) pageReadiness(ctx context.Context) readiness {
	res, ok := s.ready.get(ctx, s.cfg.ReadinessMaxAge, s.checkReady)
	if !ok {
		return readiness{}
	}
	reasons, _ := res.body["reasons"].([]string)
	return readiness{Known: true, Ready: res.status == http.StatusOK, Reasons: reasons}
}

// outcomeCount is one row of the page's event outcome counts.
type outcomeCount struct {
	Outcome, Meaning string
	Count            uint64
}

// pageOutcomes lists Sources.Outcomes in a fixed order; nil when the relay
// plugged none in (a process without a correlator).
func (s *Server) pageOutcomes() []outcomeCount {
	o, ok := s.metrics.outcomes()
	if !ok {
		return nil
	}
	return []outcomeCount{
		{"started", "a trigger: started its sagas", o.Started},
		{"reply", "went to reply correlation", o.Reply},
		{"ignored", "no saga listens to its type (by design)", o.Ignored},
		{"filtered", "a trigger's filter said no", o.Filtered},
		{"parked", "could not be used: a dead letter", o.Parked},
	}
}

// parkedSink is one sink's parked events on the dead letters page.
type parkedSink struct {
	Name   string
	Kind   string
	Events []sink.ParkedEvent
}

type deadLettersData struct {
	layoutData
	Ready       readiness
	Outcomes    []outcomeCount
	DeadLetters []deadLetter
	DeadErr     string
	Sinks       []parkedSink
	SinksErr    string
	// ScopedSinks: a tenant-scoped visitor sees the sinks holding its
	// tenant's parked events only.
	ScopedSinks bool
}

// pageListLimit bounds each list of the dead letters page.
const pageListLimit = 100

// deadLettersPage shows what the relay could not use or deliver: the
// correlator's dead letters, each sink's parked events (with a skip button
// for an operate token), the event outcome counts and the ready state.
func (s *Server) deadLettersPage(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	c := s.pageCaller(r)
	d := deadLettersData{layoutData: s.layout(r, "Dead letters"), Ready: s.pageReadiness(ctx), Outcomes: s.pageOutcomes(),
		ScopedSinks: c.Tenant.Valid}
	var err error
	if d.DeadLetters, err = s.deadLetters(r, correlator.DeadLetterFilter{Pending: true, Limit: pageListLimit, Tenant: c.Tenant}); err != nil {
		if s.outagePage(w, r, err) {
			return
		}
		s.log.Warn("page: dead letters", "err", err)
		d.DeadErr = "cannot read the dead letters; see the relay's log"
	}
	sinks, err := sink.List(ctx, s.cfg.Pool)
	if err != nil {
		s.log.Warn("page: sinks", "err", err)
		d.SinksErr = "cannot read the sinks' state; see the relay's log"
	}
	for _, st := range sinks {
		if st.Parked == 0 {
			continue
		}
		evs, err := sink.ListParked(ctx, s.cfg.Pool, st.Name, sink.ParkedFilter{Tenant: c.Tenant, Limit: pageListLimit})
		if err != nil {
			s.log.Warn("page: parked events", "sink", st.Name, "err", err)
			d.SinksErr = "cannot read the parked events; see the relay's log"
			break
		}
		if len(evs) > 0 {
			d.Sinks = append(d.Sinks, parkedSink{Name: st.Name, Kind: st.Kind, Events: evs})
		}
	}
	s.render(w, r, deadLettersView(d), http.StatusOK)
}

// fmtAge writes a number of seconds as a short age: 42s, 3m05s, 2h07m, 3d04h.
func fmtAge(seconds float64) string {
	d := time.Duration(seconds * float64(time.Second)).Round(time.Second)
	switch {
	case d < time.Minute:
		return d.String()
	case d < time.Hour:
		return fmtTwo(int(d/time.Minute), "m", int(d%time.Minute/time.Second), "s")
	case d < 24*time.Hour:
		return fmtTwo(int(d/time.Hour), "h", int(d%time.Hour/time.Minute), "m")
	default:
		return fmtTwo(int(d/(24*time.Hour)), "d", int(d%(24*time.Hour)/time.Hour), "h")
	}
}

func fmtTwo(a int, ua string, b int, ub string) string {
	return fmt.Sprintf("%d%s%02d%s", a, ua, b, ub)
}
