// Package backoff computes the capped exponential waits with jitter that the
// stream's reconnects, the sinks' parked deliveries and the saga steps'
// retries share. Each caller keeps its own base, factor, cap and jitter.
package backoff

import (
	"math"
	"math/rand/v2"
	"time"
)

// Policy is a capped exponential backoff: the wait after n earlier failures
// is min(Max, Base·Factorⁿ), of which a fraction Jitter is drawn at random,
// so that it lies in [d·(1−Jitter), d]. Jitter only shortens the wait, so Max
// stays a cap, and many clients failing together do not retry in lockstep.
type Policy struct {
	Base   time.Duration
	Factor float64 // at least 1; 0 means 2
	Max    time.Duration
	Jitter float64 // in [0, 1]
}

// Delay returns the wait after n earlier failures (0 for the first wait).
func (p Policy) Delay(n int) time.Duration { return p.DelayAt(n, rand.Float64()) }

// DelayAt is Delay with the random draw r in [0, 1) given (tests).
func (p Policy) DelayAt(n int, r float64) time.Duration {
	n = max(n, 0)
	factor := p.Factor
	if factor == 0 {
		factor = 2
	}
	d := float64(p.Base) * math.Pow(factor, float64(n))
	if d > float64(p.Max) || math.IsInf(d, 0) || math.IsNaN(d) {
		d = float64(p.Max)
	}
	d -= d * p.Jitter * r
	return time.Duration(d)
}
