package journaltest

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
)

// testConcurrentClaims runs 2 journals (two pools in PostgreSQL) with 8
// workers each over 10,000 instances (1,000 with -short). Each worker claims
// a batch, heartbeats its first instance, then for every instance completes
// step 0 (unless a previous holder did) and marks it COMPLETED.
//
// Time is the harness clock, moved by the test: every tickEvery operations it
// advances by one tick, and leases last leaseTicks ticks, so that a worker
// with a large batch outlives its leases and its instances are taken over.
// One batch in stallEvery is processed only after its leases have expired: a
// zombie that keeps going. The clock never moves while a call is in flight
// (a RWMutex), so the test knows the exact instant of every call and checks:
//
//   - a claim never takes an instance whose lease is live at that instant;
//   - a fenced write succeeds exactly when the writer's lease is live;
//   - every instance ends COMPLETED once, with exactly two events.
func testConcurrentClaims(t *testing.T, h Harness) {
	n := 10000
	if testing.Short() {
		n = 1000
	}
	const (
		pools, workers = 2, 8
		batchSize      = 10
		tick           = time.Second
		tickEvery      = 48
		leaseTicks     = 8
		leaseD         = leaseTicks * tick
		stallEvery     = 20
	)
	journals := []saga.Journal{h.Journal, h.Journal}
	if h.Peer != nil {
		journals[1] = h.Peer(t)
	}
	began := time.Now()
	seed(t, h.Journal, n)
	seeded := time.Now()

	var (
		gate sync.RWMutex // readers: calls in flight; writer: the clock moving
		ops  atomic.Int64

		mu         sync.Mutex
		holders    = map[uuid.UUID]*holding{}
		leases     = map[uuid.UUID]bool{}
		completed  = map[uuid.UUID]int{}
		violations []string

		terminals, takeovers                     atomic.Int64
		staleBeats, staleAppends, staleTerminals atomic.Int64
	)
	violate := func(format string, args ...any) {
		if len(violations) < 20 {
			violations = append(violations, fmt.Sprintf(format, args...))
		}
	}
	advance := func(d time.Duration) {
		gate.Lock()
		h.Clock.Advance(d)
		gate.Unlock()
	}
	// call runs fn at one clock reading that cannot change until fn returns.
	call := func(fn func(now time.Time)) {
		gate.RLock()
		fn(h.Clock.Now())
		gate.RUnlock()
		if ops.Add(1)%tickEvery == 0 {
			advance(tick)
		}
	}
	// live reports, from the test's own record, whether lease is held.
	live := func(id, lease uuid.UUID, now time.Time) bool {
		mu.Lock()
		defer mu.Unlock()
		hd := holders[id]
		return hd != nil && hd.lease == lease && !hd.released && !hd.expires.Before(now)
	}

	deadline := time.Now().Add(150 * time.Second)
	var wg sync.WaitGroup
	for p := range pools {
		j := journals[p]
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				batches := 0
				for terminals.Load() < int64(n) {
					if time.Now().After(deadline) {
						mu.Lock()
						violate("pool %d worker %d: out of time with %d of %d instances done", p, w, terminals.Load(), n)
						mu.Unlock()
						return
					}
					var batch []saga.Instance
					var claimErr error
					call(func(now time.Time) {
						batch, claimErr = j.ClaimPending(ctx, batchSize, leaseD)
						mu.Lock()
						defer mu.Unlock()
						for _, inst := range batch {
							hd := holders[inst.ID]
							if hd != nil && !hd.released {
								if !hd.expires.Before(now) {
									violate("instance %s claimed at %v while lease %s is live until %v", inst.ID, now, hd.lease, hd.expires)
								}
								takeovers.Add(1)
							}
							if leases[inst.LeaseID.UUID] || !inst.LeaseID.Valid {
								violate("claim returned a reused or missing lease %v", inst.LeaseID)
							}
							leases[inst.LeaseID.UUID] = true
							if inst.LeaseExpiresAt == nil || !inst.LeaseExpiresAt.Equal(now.Add(leaseD)) {
								violate("lease expiry %v, want %v", inst.LeaseExpiresAt, now.Add(leaseD))
							}
							holders[inst.ID] = &holding{lease: inst.LeaseID.UUID, expires: now.Add(leaseD)}
						}
					})
					if claimErr != nil {
						mu.Lock()
						violate("claim: %v", claimErr)
						mu.Unlock()
						return
					}
					if len(batch) == 0 {
						time.Sleep(200 * time.Microsecond)
						continue
					}
					batches++
					if batches%stallEvery == 3 {
						// A zombie: it stalls past its leases, then carries on.
						stallUntil(h.Clock, batch[len(batch)-1].LeaseExpiresAt.Add(time.Microsecond), &ops, advance)
					}
					for i, inst := range batch {
						id, lease := inst.ID, inst.LeaseID.UUID
						// A runner heartbeats now and then, not before every
						// step; the first of a batch is enough to test it
						// (and after a stall it is stale).
						if i == 0 {
							call(func(now time.Time) {
								want := live(id, lease, now)
								ok, err := j.Heartbeat(ctx, id, lease, leaseD)
								mu.Lock()
								defer mu.Unlock()
								switch {
								case err != nil:
									violate("heartbeat: %v", err)
								case ok != want:
									violate("heartbeat %s at %v: ok=%t, lease live=%t", id, now, ok, want)
								case ok:
									holders[id].expires = now.Add(leaseD)
								default:
									staleBeats.Add(1)
								}
							})
						}
						if inst.CurrentStep == 0 {
							call(func(now time.Time) {
								want := live(id, lease, now)
								_, err := j.Append(ctx, id, lease, saga.Event{Kind: saga.EventStepCompleted, Step: 0, Actor: lease.String()})
								mu.Lock()
								defer mu.Unlock()
								switch {
								case err != nil && !errors.Is(err, saga.ErrLeaseLost):
									violate("append: %v", err)
								case (err == nil) != want:
									violate("append %s at %v: err=%v, lease live=%t", id, now, err, want)
								case err != nil:
									staleAppends.Add(1)
								}
							})
						}
						call(func(now time.Time) {
							want := live(id, lease, now)
							ok, err := j.MarkTerminal(ctx, id, lease, saga.StatusCompleted, lease.String())
							mu.Lock()
							defer mu.Unlock()
							switch {
							case err != nil:
								violate("mark terminal: %v", err)
							case ok != want:
								violate("mark terminal %s at %v: ok=%t, lease live=%t", id, now, ok, want)
							case ok:
								holders[id].released = true
								completed[id]++
								terminals.Add(1)
							default:
								staleTerminals.Add(1)
							}
						})
					}
				}
			}()
		}
	}
	wg.Wait()
	if len(violations) > 0 {
		t.Fatalf("%d+ violations, first: %v", len(violations), violations)
	}
	if len(completed) != n {
		t.Fatalf("%d instances completed, want %d", len(completed), n)
	}
	for id, c := range completed {
		if c != 1 {
			t.Fatalf("instance %s marked terminal %d times", id, c)
		}
	}
	t.Logf("seeded in %s, ran in %s", seeded.Sub(began).Round(time.Millisecond), time.Since(seeded).Round(time.Millisecond))
	t.Logf("%d instances, %d operations, %d takeovers; stale writes rejected: %d heartbeats, %d appends, %d mark-terminals",
		n, ops.Load(), takeovers.Load(), staleBeats.Load(), staleAppends.Load(), staleTerminals.Load())
	if takeovers.Load() == 0 || staleBeats.Load() == 0 || staleAppends.Load() == 0 || staleTerminals.Load() == 0 {
		t.Fatal("the race did not happen (no takeover or no rejected stale write of each kind): the test proved nothing")
	}
	checkHistories(t, h.Journal, n)
}

type holding struct {
	lease    uuid.UUID
	expires  time.Time
	released bool
}

// stallUntil waits for the other workers to move the clock to at. If they
// stop moving it (nothing left for them to do) it moves the clock itself;
// jumping while they work would expire every lease at once.
func stallUntil(c *Clock, at time.Time, ops *atomic.Int64, advance func(time.Duration)) {
	last, idleSince := ops.Load(), time.Now()
	for c.Now().Before(at) {
		time.Sleep(200 * time.Microsecond)
		if n := ops.Load(); n != last {
			last, idleSince = n, time.Now()
			continue
		}
		if time.Since(idleSince) > 20*time.Millisecond {
			if d := at.Sub(c.Now()); d > 0 {
				advance(d)
			}
			return
		}
	}
}

// seed enqueues n instances from 8 goroutines.
func seed(t *testing.T, j saga.Journal, n int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += 8 {
				if err := j.Enqueue(ctx, newInstance()); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("seed: %v", err)
	}
}

// checkHistories reads the whole journal as a tailer would and checks that
// every instance has exactly step_completed then completed: no stale writer
// slipped an event in.
func checkHistories(t *testing.T, j saga.Journal, n int) {
	t.Helper()
	kinds := map[uuid.UUID][]saga.EventKind{}
	evs := tailN(t, j, 0, 2*n, 2000)
	// Nothing beyond the 2n events either.
	waitHead(t, j, evs[len(evs)-1].GlobalSeq)
	for _, ev := range evs {
		if int64(len(kinds[ev.InstanceID])+1) != ev.Version {
			t.Fatalf("instance %s: version %d after %d events", ev.InstanceID, ev.Version, len(kinds[ev.InstanceID]))
		}
		kinds[ev.InstanceID] = append(kinds[ev.InstanceID], ev.Kind)
	}
	if len(kinds) != n {
		t.Fatalf("journal holds events of %d instances, want %d", len(kinds), n)
	}
	for id, ks := range kinds {
		if len(ks) != 2 || ks[0] != saga.EventStepCompleted || ks[1] != saga.EventCompleted {
			t.Fatalf("instance %s history %v, want [step_completed completed]", id, ks)
		}
	}
}
