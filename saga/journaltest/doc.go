// Package journaltest is the conformance suite every saga.Journal passes: the
// in-memory reference (saga/memjournal) and PostgreSQL (saga/pgjournal) run
// the same assertions, so that the reference is what PostgreSQL does.
//
// Usage, in an implementation's tests:
//
//	func TestConformance(t *testing.T) {
//		journaltest.Run(t, func(t *testing.T) journaltest.Harness {
//			clock := journaltest.NewClock(journaltest.Epoch)
//			return journaltest.Harness{Journal: memjournal.New(clock.Now), Clock: clock}
//		})
//	}
//
// The suite controls time through the Harness's Clock: the journal must take
// every instant (claims, lease expiry, fences, next_attempt_at, created_at)
// from it, which is how the lease boundary is tested to the microsecond.
package journaltest
