package saga

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// The instance's lease while a worker holds it: the clock it reads, the
// heartbeat that keeps the lease, and its release.

// now is the journal's clock, extrapolated from the claim: the lease expiry
// the journal stamped minus the lease duration is its time at the claim.
// Deadlines and reply timeouts are judged on it, not on the local clock.
func (w *work) now() time.Time { return w.dbAt.Add(time.Since(w.localAt)) }

// heartbeat extends the lease every third of its duration until done. A
// refused heartbeat, or none accepted for a whole lease, loses the lease:
// lose cancels every context of the instance's work.
//
// It runs beside the worker, which replaces w.inst as the instance advances:
// it reads only w.id (not w.inst.ID) and fields that do not change.
func (w *work) heartbeat(ctx context.Context, lose context.CancelCauseFunc, done <-chan struct{}) {
	t := time.NewTicker(w.r.cfg.LeaseDuration / 3)
	defer t.Stop()
	last := w.localAt
	for {
		select {
		case <-done:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !w.beat(ctx, lose, &last) {
			return
		}
	}
}

// beat extends the lease once; last is when the lease was last known held.
// It reports false once the lease is lost (lose was called) or ctx ended.
func (w *work) beat(ctx context.Context, lose context.CancelCauseFunc, last *time.Time) bool {
	if ctx.Err() != nil {
		return false
	}
	d := w.r.cfg.LeaseDuration
	sent := time.Now()
	hctx, cancel := context.WithTimeout(ctx, d/3)
	ok, err := w.r.journal.Heartbeat(hctx, w.id, w.lease, d)
	cancel()
	switch {
	case err == nil && ok:
		*last = sent
	case err == nil:
		w.log.Warn("saga lease lost: heartbeat refused")
		lose(errLeaseGone)
		return false
	default:
		if ctx.Err() != nil {
			return false
		}
		w.r.throttle.Warn("heartbeat", "saga heartbeat failed", "err", err)
		if time.Since(*last) >= d {
			lose(errLeaseGone)
			return false
		}
	}
	return true
}

// release gives the lease back so that the instance's next attempt, or
// another runner, need not wait for it to expire; no attempt is under way.
// A journal with a Release method is asked to release, which also closes
// the open step (Instance.OpenStep); any other gets releaseOpen's heartbeat,
// and its next claim then takes the step for interrupted.
func (w *work) release(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	rel, ok := w.r.journal.(leaseReleaser)
	if !ok {
		w.releaseOpen(ctx)
		return
	}
	rctx, cancel := context.WithTimeout(ctx, w.r.cfg.LeaseDuration/3)
	defer cancel()
	if _, err := rel.Release(rctx, w.inst.ID, w.lease); err != nil {
		w.log.Warn("saga lease release failed: it will expire", "err", err)
	}
}

// releaseOpen gives the lease back leaving the open step open, after an
// attempt that was cut short and may have acted: the next claim reports it
// and the next holder records it (step_interrupted). It is a heartbeat of
// one microsecond, which shortens the lease to "now" on the journal's own
// clock within the Heartbeat contract (a journal that only ever extends
// leaves it to expire).
func (w *work) releaseOpen(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, w.r.cfg.LeaseDuration/3)
	defer cancel()
	if _, err := w.r.journal.Heartbeat(rctx, w.inst.ID, w.lease, time.Microsecond); err != nil {
		w.log.Warn("saga lease release failed: it will expire", "err", err)
	}
}

// leaseReleaser is implemented by journals that can give a lease back:
// Release clears the lease and the open step of an instance whose lease
// leaseID is held, and reports false (nothing changed) when it is not.
type leaseReleaser interface {
	Release(ctx context.Context, instanceID, leaseID uuid.UUID) (bool, error)
}
