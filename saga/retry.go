package saga

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/compensa/compensa/internal/backoff"
)

// RetryPolicy says how often, and how far apart, a step or a compensation is
// attempted. A zero field takes the default of the policy it belongs to
// (DefaultStepRetry for Step.Retry, DefaultCompensationRetry for
// Step.CompensationRetry), so a step may set only the field it cares about.
//
// The delay before attempt n+1 is min(Max, Base·Factorⁿ⁻¹), of which a
// fraction Jitter is drawn at random: the delay lies in
// [d·(1−Jitter), d]. Jitter only shortens the delay, so Max stays a cap, and
// many instances failing together (a dependency that went down) do not retry
// in lockstep.
type RetryPolicy struct {
	// MaxAttempts counts every attempt, the first included: 1 means never
	// retry. Exhausting it fails the step for good (the saga compensates) or
	// the compensation for good (the instance ends FAILED).
	MaxAttempts int
	// Base is the delay after the first failed attempt.
	Base time.Duration
	// Factor multiplies the delay after each further failure; at least 1.
	Factor float64
	// Max caps the delay.
	Max time.Duration
	// Jitter is the fraction of each delay drawn at random, in [0, 1]. Zero
	// takes the default; a negative value disables jitter (tests that time
	// the backoff).
	Jitter float64
}

// DefaultStepRetry is the policy of a step that sets none: 10 attempts, 1s,
// ×2, capped at 5 minutes (the 10th attempt comes about 8½ minutes after the
// first), 20% jitter.
var DefaultStepRetry = RetryPolicy{MaxAttempts: 10, Base: time.Second, Factor: 2, Max: 5 * time.Minute, Jitter: 0.2}

// DefaultCompensationRetry is more patient than DefaultStepRetry, because a
// compensation that gives up leaves the system worse than the failure it was
// undoing: 20 attempts, 1s, ×2, capped at 10 minutes (about 2½ hours in all),
// 20% jitter.
var DefaultCompensationRetry = RetryPolicy{MaxAttempts: 20, Base: time.Second, Factor: 2, Max: 10 * time.Minute, Jitter: 0.2}

// WithDefaults fills the zero fields of p from def (DefaultStepRetry or
// DefaultCompensationRetry) and turns a negative Jitter into none.
func (p RetryPolicy) WithDefaults(def RetryPolicy) RetryPolicy {
	if p.MaxAttempts == 0 {
		p.MaxAttempts = def.MaxAttempts
	}
	if p.Base == 0 {
		p.Base = def.Base
	}
	if p.Factor == 0 {
		p.Factor = def.Factor
	}
	if p.Max == 0 {
		// A Base above the default cap would otherwise be refused for a
		// cap the step never set.
		p.Max = max(def.Max, p.Base)
	}
	if p.Jitter == 0 {
		p.Jitter = def.Jitter
	}
	if p.Jitter < 0 {
		p.Jitter = 0
	}
	return p
}

// validate checks the policy as the step declared it; field is its name in
// the step ("Retry", "CompensationRetry") so that the message names it.
func (p RetryPolicy) validate(field string, def RetryPolicy) error {
	switch {
	case p.MaxAttempts < 0:
		return fmt.Errorf("%s.MaxAttempts must not be negative, got %d", field, p.MaxAttempts)
	case p.Base < 0:
		return fmt.Errorf("%s.Base must not be negative, got %s", field, p.Base)
	case p.Max < 0:
		return fmt.Errorf("%s.Max must not be negative, got %s", field, p.Max)
	case p.Factor != 0 && (p.Factor < 1 || math.IsNaN(p.Factor) || math.IsInf(p.Factor, 0)):
		return fmt.Errorf("%s.Factor must be at least 1, got %v", field, p.Factor)
	case p.Jitter > 1 || math.IsNaN(p.Jitter):
		return fmt.Errorf("%s.Jitter must be at most 1 (a fraction of the delay), got %v", field, p.Jitter)
	}
	eff := p.WithDefaults(def)
	if eff.Max < eff.Base {
		return fmt.Errorf("%s.Max (%s) must not be below %s.Base (%s)", field, eff.Max, field, eff.Base)
	}
	return nil
}

// Delay returns the wait after failed attempt n (1 for the first failure),
// jitter included. Call it on a policy whose defaults are filled
// (WithDefaults): a zero Base means no wait at all.
func (p RetryPolicy) Delay(n int) time.Duration {
	return p.delay(n, rand.Float64())
}

// delay is Delay with the random draw r in [0, 1) given, for tests.
func (p RetryPolicy) delay(n int, r float64) time.Duration {
	return backoff.Policy{Base: p.Base, Factor: p.Factor, Max: p.Max, Jitter: p.Jitter}.DelayAt(max(n, 1)-1, r)
}

// RoundDelay rounds a retry delay to the millisecond (one under a
// millisecond to the microsecond): the delay is journaled, logged and shown
// to people, and 194.600885ms says nothing 195ms does not.
func RoundDelay(d time.Duration) time.Duration {
	if d < time.Millisecond {
		return d.Round(time.Microsecond)
	}
	return d.Round(time.Millisecond)
}

// withJitter takes the policy's jitter off d, as Delay does.
func (p RetryPolicy) withJitter(d time.Duration) time.Duration {
	return backoff.Policy{Base: d, Factor: 1, Max: d, Jitter: p.Jitter}.DelayAt(0, rand.Float64())
}
