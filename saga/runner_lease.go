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
// another runner, need not wait for it to expire. A journal with a Release
// method is asked to release; any other gets a heartbeat of one microsecond,
// which shortens the lease to "now" on its own clock within the Heartbeat
// contract (a journal that only ever extends leaves it to expire).
func (w *work) release(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, w.r.cfg.LeaseDuration/3)
	defer cancel()
	var err error
	if rel, ok := w.r.journal.(leaseReleaser); ok {
		_, err = rel.Release(rctx, w.inst.ID, w.lease)
	} else {
		_, err = w.r.journal.Heartbeat(rctx, w.inst.ID, w.lease, time.Microsecond)
	}
	if err != nil {
		w.log.Warn("saga lease release failed: it will expire", "err", err)
	}
}

// leaseReleaser is implemented by journals that can give a lease back.
type leaseReleaser interface {
	Release(ctx context.Context, instanceID, leaseID uuid.UUID) (bool, error)
}
