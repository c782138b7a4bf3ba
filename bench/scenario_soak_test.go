package bench

import (
	"bytes"
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestRateBucketsCountsMarksPerSecondOfEachWindow(t *testing.T) {
	t.Parallel()
	sec := int64(time.Second)
	// Windows of 1 s over [1 s, 3 s): marks at 1.2 and 1.5 s fall in the
	// first, 2.9 s in the second; 0 (none), 0.5 s and 3 s fall in neither.
	ts := []int64{0, sec / 2, sec + sec/5, sec + sec/2, 2*sec + 9*sec/10, 3 * sec}
	got := rateBuckets(ts, sec, 3*sec, 2)
	if want := []float64{2, 1}; !slices.Equal(got, want) {
		t.Fatalf("rateBuckets = %v, want %v", got, want)
	}
	if r := lastOverFirst(got); r != 0.5 {
		t.Fatalf("lastOverFirst = %v, want 0.5", r)
	}
	if r := lastOverFirst([]float64{0, 3}); !math.IsNaN(r) {
		t.Fatalf("lastOverFirst with a first of 0 = %v, want NaN", r)
	}
}

func TestLatencyBucketsTakesEachGroupsPercentileAndBoundsTheUnfinished(t *testing.T) {
	t.Parallel()
	ms := int64(time.Millisecond)
	// Four events in two groups by sequence. Group 1: 10 and 30 ms.
	// Group 2: one without a commit (skipped) and one without an end,
	// which counts until stop (1000 - 100 ms).
	commit := []int64{100 * ms, 200 * ms, 0, 100 * ms}
	end := []int64{110 * ms, 230 * ms, 500 * ms, 0}
	got := latencyBuckets(commit, end, 2, 1000*ms, 0.99)
	if want := []float64{30, 900}; !slices.Equal(got, want) {
		t.Fatalf("latencyBuckets = %v, want %v", got, want)
	}
	got = latencyBuckets(commit[:1], end[:1], 2, 1000*ms, 0.99)
	if !math.IsNaN(got[0]) || got[1] != 10 {
		t.Fatalf("latencyBuckets of one event in two groups = %v, want [NaN 10]", got)
	}
}

func TestTableGrowthComparesTheEndWithTheFirstSampleAtTheReference(t *testing.T) {
	t.Parallel()
	samples := []SoakSample{{T: 0, TableBytes: 10}, {T: 119, TableBytes: 90}, {T: 121, TableBytes: 100}, {T: 600, TableBytes: 120}}
	ref, end, g := tableGrowth(samples, 2*time.Minute)
	if ref != 100 || end != 120 || g == nil || *g != 1.2 {
		t.Fatalf("tableGrowth = %d, %d, %v; want 100, 120, 1.2", ref, end, g)
	}
	// A run that ends before the reference has no growth to report.
	if _, _, g := tableGrowth(samples[:2], 2*time.Minute); g != nil {
		t.Fatalf("tableGrowth of a run shorter than the reference = %v, want nil", *g)
	}
	// Nor one whose reference is its last sample.
	if _, _, g := tableGrowth(samples[:3], 2*time.Minute); g != nil {
		t.Fatalf("tableGrowth with the reference as the last sample = %v, want nil", *g)
	}
}

func TestSoakBucketsGroupLatencyByCommitWindow(t *testing.T) {
	t.Parallel()
	sec := int64(time.Second)
	commit := []int64{sec, sec + sec/2, 2 * sec}
	end := []int64{sec + sec/10, 2*sec + sec/2, 2*sec + sec/10}
	b := soakBucketsOf(commit, end, sec, 3*sec, 4*sec, 2)
	if len(b) != 2 || b[0].T != 0.5 || b[1].T != 1.5 {
		t.Fatalf("buckets = %+v, want two centred at 0.5 s and 1.5 s", b)
	}
	if b[0].EndP99Ms == nil || *b[0].EndP99Ms != 1000 || b[1].EndP99Ms == nil || *b[1].EndP99Ms != 100 {
		t.Fatalf("bucket p99s = %v, %v; want 1000 and 100 ms", deref(b[0].EndP99Ms), deref(b[1].EndP99Ms))
	}
	if b[0].SagasPerSec != 1 || b[1].SagasPerSec != 2 {
		t.Fatalf("bucket rates = %v, %v; want 1 and 2", b[0].SagasPerSec, b[1].SagasPerSec)
	}
}

func TestNiceTicksCoverTheRangeInRoundSteps(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		hi   float64
		want []float64
	}{
		{17.3, []float64{0, 5, 10, 15, 20}},
		{1000, []float64{0, 200, 400, 600, 800, 1000}},
		{0.7, []float64{0, 0.2, 0.4, 0.6000000000000001, 0.8}},
		{0, []float64{0, 1}},
		{math.NaN(), []float64{0, 1}},
	} {
		got := niceTicks(c.hi)
		if !slices.Equal(got, c.want) {
			t.Errorf("niceTicks(%v) = %v, want %v", c.hi, got, c.want)
		}
		if got[len(got)-1] < c.hi {
			t.Errorf("niceTicks(%v) ends below the range: %v", c.hi, got)
		}
	}
}

func TestSoakPlotDrawsALinePerRunInEachPanel(t *testing.T) {
	t.Parallel()
	p99 := 12.5
	runs := []SoakRun{
		{Name: "soak", Sagas: 100, Rate: 10, Buckets: []SoakBucket{{T: 5, SagasPerSec: 10, EndP99Ms: &p99}, {T: 15, SagasPerSec: 9}},
			Samples: []SoakSample{{T: 0, TableBytes: 1 << 20}, {T: 20, TableBytes: 2 << 20}}},
		{Name: "soak-noretention", Sagas: 100, Rate: 10, Buckets: []SoakBucket{{T: 5, SagasPerSec: 10, EndP99Ms: &p99}},
			Samples: []SoakSample{{T: 0, TableBytes: 1 << 20}, {T: 10, TableBytes: -1}}},
	}
	var b bytes.Buffer
	if err := writeSoakPlot(&b, runs); err != nil {
		t.Fatal(err)
	}
	svg := b.String()
	if !strings.HasPrefix(svg, "<svg ") || !strings.HasSuffix(svg, "</svg>\n") {
		t.Fatalf("not one SVG document:\n%s", svg)
	}
	if n := strings.Count(svg, "<polyline"); n != 6 {
		t.Fatalf("%d lines drawn, want 6 (3 panels × 2 runs)", n)
	}
	if !strings.Contains(svg, "soak-noretention") {
		t.Fatal("the legend does not name the second run")
	}
}

func TestSummaryNamesEachSoakRunsFiguresByItsRetention(t *testing.T) {
	t.Parallel()
	one, two := 1.0, 2.0
	r := &Report{Soak: &SoakResult{CapacitySagasPerSec: 500, Runs: []SoakRun{
		{Name: "soak", Retention: true, Sagas: 10, Rate: 5, ThroughputRatio: &one, TableBytesGrowth: &one, TableBytesEnd: 1 << 20,
			TenthEndP99Ms: []*float64{&one, nil}, RSSMBMax: 100},
		{Name: "soak-noretention", Sagas: 20, Rate: 5, ThroughputRatio: &two, TableBytesGrowth: &two, TableBytesEnd: 2 << 20, RSSMBMax: 200},
	}}}
	s := r.Summary()
	if s.SoakSagas == nil || *s.SoakSagas != 10 || s.SoakNoretSagas == nil || *s.SoakNoretSagas != 20 {
		t.Fatalf("soak_sagas %v, soak_noret_sagas %v; want 10 and 20", s.SoakSagas, s.SoakNoretSagas)
	}
	if *s.SoakTableBytesGrowth != 1 || *s.SoakNoretTableBytesGrowth != 2 || *s.SoakTableMBEnd != 1 || *s.SoakNoretTableMBEnd != 2 {
		t.Fatalf("growths %v, %v and MB %v, %v; want 1, 2, 1, 2", *s.SoakTableBytesGrowth, *s.SoakNoretTableBytesGrowth, *s.SoakTableMBEnd, *s.SoakNoretTableMBEnd)
	}
	if len(s.SoakEndP99Ms) != 2 || s.SoakEndP99Ms[1] != nil || *s.SoakRSSMBMax != 100 || *s.SoakNoretRSSMBMax != 200 {
		t.Fatalf("soak_end_p99_ms %v, RSS %v and %v", s.SoakEndP99Ms, *s.SoakRSSMBMax, *s.SoakNoretRSSMBMax)
	}
	// Not measured is null, not omitted.
	if b, _ := json.Marshal((&Report{}).Summary()); !bytes.Contains(b, []byte(`"soak_throughput_ratio":null`)) || !bytes.Contains(b, []byte(`"soak_noret_end_p99_ms":null`)) {
		t.Fatalf("an unmeasured soak's keys are not null: %s", b)
	}
}
