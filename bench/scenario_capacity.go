package bench

import (
	"context"
	"fmt"
	"math"
	"time"
)

// capacityScenario measures latency at a load this machine can carry, and
// what a load it cannot carry costs:
//
//  1. The sustainable saga rate: the whole relay (producer, stream,
//     correlator and runner executing the three-step bench saga, as in the
//     latency scenario) on one machine, while the producer holds a ramp of
//     rates (findCapacity). A rate is sustained when, over the held window
//     after a settling time, the producer committed the rate and the sagas
//     completed as fast as their triggers were committed (the backlog,
//     triggers committed minus sagas COMPLETED, grew by less than 5 % of
//     what was produced). The rates grow geometrically until one is not
//     sustained (twice in a row: one window can be sunk by a burst of
//     other work on a shared machine), then bisect between the highest
//     sustained and the lowest not sustained; the capacity is the highest
//     rate sustained.
//  2. 25 %, 50 % and 75 % of that rate, each held on a fresh relay over
//     empty tables, as the latency scenario measures a rate: start, first
//     step and end latency.
//  3. Overload: twice that rate, so that a backlog builds; the steps/s from
//     the producer's start until the last saga COMPLETED, over the
//     sustainable steps/s (three per saga), is overload_steps_ratio.
func (r *run) capacityScenario(ctx context.Context) error {
	res := &CapacityResult{}
	r.report.Capacity = res
	capacity, err := r.findCapacity(ctx, res)
	if err != nil {
		return err
	}
	res.SagasPerSec = float64(capacity)
	r.progress("capacity: %d sagas/s sustained", capacity)
	for _, pct := range capacityLevels {
		rt := max(1, int(math.Round(float64(capacity)*float64(pct)/100)))
		r.progress("capacity: %d %% of it: %d sagas/s for %s", pct, rt, r.sz.capacityLevel)
		c, err := r.latencyCase(ctx, rt, r.sz.capacityLevel)
		if err != nil {
			return fmt.Errorf("%d %% (%d sagas/s): %w", pct, rt, err)
		}
		res.Levels = append(res.Levels, CapacityLevel{Percent: pct, LatencyCase: c})
	}
	rt := 2 * capacity
	r.progress("capacity: overload: %d sagas/s (twice the sustainable rate) for %s", rt, r.sz.overloadDuration)
	c, err := r.latencyCase(ctx, rt, r.sz.overloadDuration)
	if err != nil {
		return fmt.Errorf("overload: %w", err)
	}
	c.Overload = true
	r.report.Overload = &c
	r.progress("capacity: overload: %.0f steps/s while the backlog existed and drained: %.2f of the sustainable %d steps/s",
		c.StepsPerSec, c.StepsPerSec/float64(capacity*benchStepsPerSaga), capacity*benchStepsPerSaga)
	return nil
}

// capacityLevels are the shares of the sustainable rate the latency curve
// holds, in percent; the JSON keys name them (curve_25_…).
var capacityLevels = []int{25, 50, 75}

// capacityMaxRate caps the ramp (sagas/s): three times the step runner's
// best figure on any machine measured so far.
const capacityMaxRate = 10000

// capacityTolerance is the share of a held window's production the backlog
// may grow by, and the share of the asked rate the producer may fall short
// by, for the rate to count as sustained.
const capacityTolerance = 0.05

// findCapacity runs the ramp on one relay and returns the highest rate it
// sustained; each held rate is appended to res.Ramp.
func (r *run) findCapacity(ctx context.Context, res *CapacityResult) (int, error) {
	sz := r.sz
	search := rampSearch{start: sz.capacityStart, growth: sz.capacityGrowth, precision: sz.capacityPrecision,
		maxSteps: sz.capacityMaxSteps, maxRate: capacityMaxRate, retries: sz.capacityRetries}
	n := 1 + sz.capacityMaxSteps*int(capacityMaxRate*sz.capacityStep.Seconds())
	p, err := r.openPipeline(ctx, n)
	if err != nil {
		return 0, err
	}
	defer p.close()
	tl := p.tl
	settle := sz.capacityStep / 3
	next := int64(1) // seq 0 was the warm-up event
	target, ok := search.next()
	for ok {
		count := int(float64(target) * sz.capacityStep.Seconds())
		began := time.Since(tl.base)
		if err := p.prod.produce(ctx, next, count, target); err != nil {
			return 0, err
		}
		ended := time.Since(tl.base)
		next += int64(count)
		produced, completed := tl.window(1, int(next-1), began+settle, ended)
		st := RampStep{Rate: target, Seconds: (ended - began - settle).Seconds()}
		st.ProducedPerSec = rate(produced, ended-began-settle)
		st.CompletedPerSec = rate(completed, ended-began-settle)
		st.Sustained = sustained(target, ended-began-settle, produced, completed)
		res.Ramp = append(res.Ramp, st)
		search.record(target, st.Sustained)
		verdict := "not sustained"
		if st.Sustained {
			verdict = "sustained"
		}
		r.progress("capacity: ramp: %d sagas/s asked, %.0f triggers/s committed, %.0f sagas/s completed: %s",
			target, st.ProducedPerSec, st.CompletedPerSec, verdict)
		if target, ok = search.next(); ok && !st.Sustained {
			// The next rate must start without the backlog this one left.
			drained, err := tl.wait(ctx, tl.end, 1, int(next-1), r.drainLimit(), p.streamErr)
			if err != nil {
				return 0, err
			}
			if !drained {
				r.progress("capacity: ramp: the backlog did not drain within %s; the search stops here", r.drainLimit())
				break
			}
		}
	}
	if search.held == 0 {
		lowest := 0
		for _, st := range res.Ramp {
			if lowest == 0 || st.Rate < lowest {
				lowest = st.Rate
			}
		}
		return 0, fmt.Errorf("the relay sustained no rate of the ramp, down to %d sagas/s (is the machine busy with other work? see the load average)", lowest)
	}
	return search.held, nil
}

// sustained reports whether a held window of a ramp kept up: the producer
// committed the asked rate, and the sagas that completed in the window were
// as many as the triggers committed in it (both within capacityTolerance).
func sustained(target int, window time.Duration, produced, completed int) bool {
	if window <= 0 || produced == 0 {
		return false
	}
	want := float64(target) * window.Seconds()
	return float64(produced) >= (1-capacityTolerance)*want && float64(completed) >= (1-capacityTolerance)*float64(produced)
}

// rampSearch chooses the capacity ramp's rates: from start, each rate is
// growth times the last sustained one, until one is not sustained; then the
// midpoint of the highest sustained and the lowest not sustained, until they
// are within precision of each other. A rate not sustained is held again, up
// to retries times, before it counts as not sustained: on a shared machine a
// burst of someone else's work can sink one window. At most maxSteps rates
// held, none above maxRate.
type rampSearch struct {
	start             int
	growth, precision float64
	maxSteps, maxRate int
	retries           int

	held, failed, steps int // 0: none yet
	retry, retried      int // the rate to hold again, and how often it was
}

// next returns the next rate to hold, or false when the search is over.
func (s *rampSearch) next() (int, bool) {
	if s.steps >= s.maxSteps {
		return 0, false
	}
	if s.retry != 0 {
		return s.retry, true
	}
	switch {
	case s.held == 0 && s.failed == 0:
		return min(s.start, s.maxRate), true
	case s.failed == 0:
		if s.held >= s.maxRate {
			return 0, false
		}
		return min(s.maxRate, max(s.held+1, int(math.Round(float64(s.held)*s.growth)))), true
	default:
		if float64(s.failed) <= float64(s.held)*(1+s.precision) {
			return 0, false
		}
		mid := (s.held + s.failed) / 2
		if mid <= s.held || mid >= s.failed {
			return 0, false
		}
		return mid, true
	}
}

// record notes whether rate was sustained.
func (s *rampSearch) record(rate int, held bool) {
	s.steps++
	if rate != s.retry {
		s.retried = 0
	}
	s.retry = 0
	switch {
	case held:
		s.held = max(s.held, rate)
	case s.retried < s.retries:
		s.retry = rate
		s.retried++
	case s.failed == 0 || rate < s.failed:
		s.failed = rate
	}
}

// window counts, among events [from, from+n), the producer commits and the
// sagas COMPLETED in the time window (a, b] since the timeline's base.
func (t *timeline) window(from int64, n int, a, b time.Duration) (produced, completed int) {
	in := func(v int64) bool { return v != 0 && v-1 > int64(a) && v-1 <= int64(b) }
	for i := from; i < from+int64(n) && i < int64(len(t.commit)); i++ {
		if in(t.commit[i].Load()) {
			produced++
		}
		if in(t.end[i].Load()) {
			completed++
		}
	}
	return produced, completed
}
