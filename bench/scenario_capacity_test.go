package bench

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/compensa/compensa/test/pgtest"
)

// runSearch drives a rampSearch against a machine that sustains every rate
// up to capacity, and returns the rates tried and the result.
func runSearch(s rampSearch, capacity int) (tried []int, held int) {
	for rate, ok := s.next(); ok; rate, ok = s.next() {
		tried = append(tried, rate)
		s.record(rate, rate <= capacity)
	}
	return tried, s.held
}

func TestRampSearchGrowsThenBisects(t *testing.T) {
	t.Parallel()
	s := rampSearch{start: 200, growth: 1.5, precision: 0.1, maxSteps: 14, maxRate: 10000}
	tried, held := runSearch(s, 1000)
	want := []int{200, 300, 450, 675, 1013, 844, 928}
	if !slices.Equal(tried, want) {
		t.Fatalf("tried %v, want %v", tried, want)
	}
	// 928 sustained, 1013 not: within 10 %, so the search stops there.
	if held != 928 {
		t.Fatalf("held = %d, want 928", held)
	}
}

func TestRampSearchQuickStopsAtItsCoarseBracket(t *testing.T) {
	t.Parallel()
	s := rampSearch{start: 200, growth: 2, precision: 0.4, maxSteps: 6, maxRate: 10000}
	tried, held := runSearch(s, 350)
	// 200, 400 (not), 300 (held): 400 ≤ 1.4 × 300, done.
	if want := []int{200, 400, 300}; !slices.Equal(tried, want) || held != 300 {
		t.Fatalf("tried %v, held %d; want %v, 300", tried, held, want)
	}
}

func TestRampSearchBoundsAndFailures(t *testing.T) {
	t.Parallel()
	// A machine faster than the cap: the search stops at the cap.
	tried, held := runSearch(rampSearch{start: 4000, growth: 2, precision: 0.1, maxSteps: 14, maxRate: 10000}, 1<<30)
	if want := []int{4000, 8000, 10000}; !slices.Equal(tried, want) || held != 10000 {
		t.Fatalf("over the cap: tried %v, held %d", tried, held)
	}
	// The step budget ends the search, keeping the best rate so far.
	tried, held = runSearch(rampSearch{start: 100, growth: 1.5, precision: 0.01, maxSteps: 3, maxRate: 10000}, 1<<30)
	if len(tried) != 3 || held != 225 {
		t.Fatalf("budget of 3: tried %v, held %d", tried, held)
	}
	// Nothing sustained: the search halves down and holds nothing, so
	// the scenario can say the lowest rate failed.
	s := rampSearch{start: 200, growth: 1.5, precision: 0.1, maxSteps: 4, maxRate: 10000}
	tried, held = runSearch(s, 10)
	if want := []int{200, 100, 50, 25}; !slices.Equal(tried, want) || held != 0 {
		t.Fatalf("too slow: tried %v, held %d", tried, held)
	}
	// A growth factor that would not move the rate still moves it.
	tried, _ = runSearch(rampSearch{start: 1, growth: 1.1, precision: 0.1, maxSteps: 3, maxRate: 10000}, 1<<30)
	if want := []int{1, 2, 3}; !slices.Equal(tried, want) {
		t.Fatalf("small rates: tried %v", tried)
	}
}

// TestRampSearchHoldsAFailedRateAgain: with retries, one window sunk by
// someone else's burst does not decide; a rate counts as not sustained only
// when every hold of it failed.
func TestRampSearchHoldsAFailedRateAgain(t *testing.T) {
	t.Parallel()
	s := rampSearch{start: 200, growth: 1.5, precision: 0.1, maxSteps: 16, maxRate: 10000, retries: 1}
	var tried []int
	noisy := true // the first hold of 200 is sunk by a burst
	for rate, ok := s.next(); ok; rate, ok = s.next() {
		tried = append(tried, rate)
		held := rate <= 500
		if rate == 200 && noisy {
			held, noisy = false, false
		}
		s.record(rate, held)
	}
	// 200 fails once and holds on the second try; 675, 562 and 506 fail
	// twice each; 478 holds: 506 ≤ 1.1 × 478, done.
	want := []int{200, 200, 300, 450, 675, 675, 562, 562, 506, 506, 478}
	if !slices.Equal(tried, want) || s.held != 478 {
		t.Fatalf("tried %v, held %d; want %v, 478", tried, s.held, want)
	}
}

func TestSustainedNeedsTheRateAndNoGrowingBacklog(t *testing.T) {
	t.Parallel()
	w := 2 * time.Second
	for _, tc := range []struct {
		produced, completed int
		want                bool
	}{
		{1000, 1000, true},
		{1000, 960, true},  // the backlog grew by 4 % of the production
		{1000, 940, false}, // by 6 %: the relay falls behind
		{960, 960, true},   // the producer 4 % short
		{900, 900, false},  // the producer 10 % short: the machine cannot commit the rate
		{1000, 1100, true}, // a backlog from before draining
		{0, 0, false},
	} {
		if got := sustained(500, w, tc.produced, tc.completed); got != tc.want {
			t.Errorf("sustained(500/s over %s, produced %d, completed %d) = %v, want %v", w, tc.produced, tc.completed, got, tc.want)
		}
	}
	if sustained(500, 0, 10, 10) {
		t.Error("an empty window cannot sustain anything")
	}
}

func TestTimelineWindowCountsCommitsAndEndsInIt(t *testing.T) {
	t.Parallel()
	tl := newTimeline(6)
	ms := int64(time.Millisecond)
	// mark stores nanoseconds since base plus one; 0 is "not yet".
	for i, c := range []int64{0, 10, 20, 30, 40, 50} {
		tl.commit[i].Store(c*ms + 1)
	}
	tl.commit[0].Store(0) // event 0 never committed
	tl.end[1].Store(15*ms + 1)
	tl.end[2].Store(35*ms + 1)
	tl.end[3].Store(45*ms + 1)
	// (20 ms, 50 ms]: commits of events 3, 4, 5 (20 ms excluded); ends of
	// events 2 and 3.
	p, c := tl.window(0, 6, 20*time.Millisecond, 50*time.Millisecond)
	if p != 3 || c != 2 {
		t.Fatalf("window = %d produced, %d completed; want 3, 2", p, c)
	}
	// A range past the timeline's end is cut, not a panic.
	if p, c := tl.window(4, 10, 0, time.Second); p != 2 || c != 0 {
		t.Fatalf("window(4, 10) = %d, %d; want 2, 0", p, c)
	}
}

// TestCapacityScenarioHoldsSharesOfWhatItFound runs the quick capacity
// scenario on a real PostgreSQL: the capacity is the highest rate the ramp
// sustained, each share of the curve and the overload run at their share of
// it, and every saga of the curve ended.
func TestCapacityScenarioHoldsSharesOfWhatItFound(t *testing.T) {
	c := pgtest.Cluster(t)
	report, err := Run(context.Background(), Config{DatabaseURL: c.URL, Quick: true, Only: "capacity"})
	if err != nil {
		t.Fatal(err)
	}
	if len(report.Errors) > 0 {
		t.Fatalf("errors: %v", report.Errors)
	}
	res := report.Capacity
	if res == nil || res.SagasPerSec <= 0 || len(res.Ramp) == 0 {
		t.Fatalf("capacity = %+v", res)
	}
	best := 0
	for _, st := range res.Ramp {
		if st.Sustained {
			best = max(best, st.Rate)
			if st.ProducedPerSec < 0.95*float64(st.Rate) || st.CompletedPerSec < 0.95*st.ProducedPerSec {
				t.Errorf("ramp step counted as sustained without keeping up: %+v", st)
			}
		}
	}
	if float64(best) != res.SagasPerSec {
		t.Fatalf("capacity %.0f, but the highest rate sustained is %d: %+v", res.SagasPerSec, best, res.Ramp)
	}
	if len(res.Levels) != 3 {
		t.Fatalf("levels = %+v", res.Levels)
	}
	for i, l := range res.Levels {
		want := max(1, int(math.Round(res.SagasPerSec*float64(capacityLevels[i])/100)))
		if l.Percent != capacityLevels[i] || l.Rate != want {
			t.Errorf("level %d: %d %% at %d sagas/s, want %d %% at %d", i, l.Percent, l.Rate, capacityLevels[i], want)
		}
		if l.End.Count != l.Produced || l.EndUnfinished != 0 || l.End.P99 <= 0 || l.FirstStep.P50 <= 0 || l.Start.P50 <= 0 {
			t.Errorf("%d %%: %d sagas produced, end %+v, %d unfinished", l.Percent, l.Produced, l.End, l.EndUnfinished)
		}
	}
	o := report.Overload
	if o == nil || !o.Overload || float64(o.Rate) != 2*res.SagasPerSec || o.StepsPerSec <= 0 {
		t.Fatalf("overload = %+v", o)
	}
	s := report.Summary()
	if s.CapacitySagasPerSec == nil || *s.CapacitySagasPerSec != res.SagasPerSec || s.OverloadStepsRatio == nil || s.Curve50EndP99Ms == nil {
		t.Fatalf("summary: capacity %v, overload %v, curve_50_end_p99_ms %v", s.CapacitySagasPerSec, s.OverloadStepsRatio, s.Curve50EndP99Ms)
	}
}
