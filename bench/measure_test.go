package bench

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestPercentilesAreNearestRank(t *testing.T) {
	t.Parallel()
	var l Latencies
	// 1..100 ms in a shuffled order: the summary must sort them.
	for i := 100; i >= 1; i-- {
		l.Add(time.Duration(i) * time.Millisecond)
	}
	s := l.Summary()
	want := LatencySummary{Count: 100, P50: 50, P95: 95, P99: 99, Max: 100}
	if s != want {
		t.Fatalf("summary = %+v, want %+v", s, want)
	}
	if got := summarize(nil); got != (LatencySummary{}) {
		t.Fatalf("empty summary = %+v", got)
	}
	one := summarize([]time.Duration{7 * time.Millisecond})
	if one.P50 != 7 || one.P99 != 7 || one.Max != 7 {
		t.Fatalf("one sample: %+v", one)
	}
}

func TestSeqOfReadsTheBenchPayload(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{`{"seq": 42, "currency": "EUR"}`, 42, true},
		{`{"currency":"EUR","seq":7}`, 7, true},
		{`{"seq": 0}`, 0, true},
		{`{"other": 1}`, 0, false},
		{`{"seq": "x"}`, 0, false},
	} {
		got, ok := seqOf([]byte(tc.in))
		if got != tc.want || ok != tc.ok {
			t.Errorf("seqOf(%s) = %d, %v; want %d, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestWithDatabaseKeepsEverythingElse(t *testing.T) {
	t.Parallel()
	got, err := withDatabase("postgres://u:secret@h:5433/app?sslmode=require", "compensa_bench_1")
	if err != nil || got != "postgres://u:secret@h:5433/compensa_bench_1?sslmode=require" {
		t.Fatalf("url: %q, %v", got, err)
	}
	got, err = withDatabase("host=h user=u dbname=app", "compensa_bench_1")
	if err != nil || got != "host=h user=u dbname=app dbname=compensa_bench_1" {
		t.Fatalf("dsn: %q, %v", got, err)
	}
}

func TestPgbenchOutputParses(t *testing.T) {
	t.Parallel()
	out := "number of transactions actually processed: 75823\nlatency average = 1.054 ms\ninitial connection time = 9.120 ms\ntps = 7583.673322 (without initial connection time)\n"
	m := pgbenchTPS.FindStringSubmatch(out)
	if m == nil || m[1] != "7583.673322" {
		t.Fatalf("tps match = %v", m)
	}
}

// requiredKeys are the keys the --json line must carry.
var requiredKeys = []string{
	"recvlogical_events_per_sec", "stream_events_per_sec", "stream_ratio", "correlate_events_per_sec",
	"correlate_ratio", "start_p99_ms", "first_step_p99_ms", "steps_per_sec", "pgbench_step_tps",
	"step_ratio", "server_ms_per_step", "peak_rss_mb", "nats_sink_events_per_sec", "nats_sink_ratio",
	// latency, overload, claim and the peers
	"end_p99_ms", "overload_steps_ratio", "claim_ms_1k", "claim_ms_1m", "peer_dbos_steps_per_sec", "peer_river_steps_per_sec",
	"nats_sink_latency_p50_ms_1k", "nats_sink_latency_p99_ms_1k", "nats_sink_latency_p50_ms_5k", "nats_sink_latency_p99_ms_5k",
	"webhook_sink_latency_p50_ms_5k", "webhook_sink_latency_p99_ms_5k", "kafka_sink_latency_p50_ms_5k", "kafka_sink_latency_p99_ms_5k",
	// the latency curve at shares of the machine's capacity
	"capacity_sagas_per_sec",
	"curve_25_start_p50_ms", "curve_25_start_p99_ms", "curve_25_first_step_p50_ms", "curve_25_first_step_p99_ms", "curve_25_end_p50_ms", "curve_25_end_p99_ms",
	"curve_50_start_p50_ms", "curve_50_start_p99_ms", "curve_50_first_step_p50_ms", "curve_50_first_step_p99_ms", "curve_50_end_p50_ms", "curve_50_end_p99_ms",
	"curve_75_start_p50_ms", "curve_75_start_p99_ms", "curve_75_first_step_p50_ms", "curve_75_first_step_p99_ms", "curve_75_end_p50_ms", "curve_75_end_p99_ms",
}

func TestSummaryCarriesEveryRequiredKey(t *testing.T) {
	t.Parallel()
	full := &Report{
		Stream: []StreamCase{
			{RowsPerTx: 1, Events: 10, RecvlogicalPerSec: 100, StreamPerSec: 95, StreamRatio: 0.95, CorrelatePerSec: 60, CorrelateRatio: 0.6},
			{RowsPerTx: 100, Events: 10, RecvlogicalPerSec: 200, StreamPerSec: 190, StreamRatio: 0.95, CorrelatePerSec: 120, CorrelateRatio: 0.6},
		},
		Latency: []LatencyCase{
			{Rate: 1000, Start: LatencySummary{P99: 12.5}, FirstStep: LatencySummary{P99: 20}, End: LatencySummary{P99: 80}},
			{Rate: 5000, Start: LatencySummary{P99: 30}, FirstStep: LatencySummary{P99: 45}},
		},
		Capacity: &CapacityResult{SagasPerSec: 1000, Levels: []CapacityLevel{
			{Percent: 25, LatencyCase: LatencyCase{Start: LatencySummary{P50: 1, P99: 2}, FirstStep: LatencySummary{P50: 3, P99: 4}, End: LatencySummary{P50: 5, P99: 6}}},
			{Percent: 50, LatencyCase: LatencyCase{Start: LatencySummary{P50: 11, P99: 12}, FirstStep: LatencySummary{P50: 13, P99: 14}, End: LatencySummary{P50: 15, P99: 16}}},
			{Percent: 75, LatencyCase: LatencyCase{Start: LatencySummary{P50: 21, P99: 22}, FirstStep: LatencySummary{P50: 23, P99: 24}, End: LatencySummary{P50: 25, P99: 26}}},
		}},
		Overload: &LatencyCase{Rate: 2000, Overload: true, StepsPerSec: 2700},
		Steps:    &StepsResult{StepsPerSec: 4000, PgbenchTPS: 8000, Ratio: 0.5, ServerMsPerStep: f64(0.2), PeerDBOS: f64(1900), PeerRiver: f64(1000)},
		Claim:    []ClaimCase{{Due: 1000, ClaimMs: 0.5, StartMs: 20}, {Due: 1000000, ClaimMs: 0.7, StartMs: 22}},
		Sinks:    &SinkCase{Events: 10, RecvlogicalPerSec: 100, NATSPerSec: 60, NATSRatio: 0.6, WebhookPerSec: 40, WebhookRatio: 0.4},
		SinkLatency: []SinkLatencyCase{
			{Sink: "nats", Rate: 1000, Latency: LatencySummary{P50: 1, P99: 2}}, {Sink: "nats", Rate: 5000, Latency: LatencySummary{P50: 3, P99: 4}},
			{Sink: "webhook", Rate: 5000, Latency: LatencySummary{P50: 5, P99: 6}}, {Sink: "kafka", Rate: 5000, Latency: LatencySummary{P50: 7, P99: 8}},
		},
		Curve: []CurvePoint{{Events: 10, PeakRSSMB: 20, CPUPer100k: 3}, {Events: 100, PeakRSSMB: 30, CPUPer100k: 2}},
	}
	var buf bytes.Buffer
	if err := full.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	if strings.Count(buf.String(), "\n") != 1 {
		t.Fatalf("the summary is not one line: %q", buf.String())
	}
	var got map[string]any
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	for _, k := range requiredKeys {
		if v, ok := got[k].(float64); !ok || v <= 0 {
			t.Errorf("%s = %v, want a positive number", k, got[k])
		}
	}
	if got["start_p99_ms"] != 12.5 || got["high_rate_start_p99_ms"] != 30.0 {
		t.Errorf("start_p99_ms must be the first (lower) rate's: %v, %v", got["start_p99_ms"], got["high_rate_start_p99_ms"])
	}
	// The overload ratio is against the sustainable steps/s (three per
	// saga of the capacity), not the step scenario's runner alone.
	if got["overload_steps_ratio"] != 0.9 || got["end_p99_ms"] != 80.0 || got["claim_ms_1m"] != 0.7 {
		t.Errorf("overload %v (want 2700/(3×1000)), end %v, claim at 1M %v", got["overload_steps_ratio"], got["end_p99_ms"], got["claim_ms_1m"])
	}
	for k, want := range map[string]float64{"capacity_sagas_per_sec": 1000,
		"curve_25_start_p50_ms": 1, "curve_25_first_step_p99_ms": 4, "curve_25_end_p99_ms": 6,
		"curve_50_start_p99_ms": 12, "curve_50_first_step_p50_ms": 13, "curve_50_first_step_p99_ms": 14, "curve_50_end_p99_ms": 16,
		"curve_75_start_p50_ms": 21, "curve_75_end_p50_ms": 25, "curve_75_end_p99_ms": 26} {
		if got[k] != want {
			t.Errorf("%s = %v, want %v", k, got[k], want)
		}
	}
	if got["peak_rss_mb"] != 30.0 || got["cpu_seconds_per_100k_events"] != 2.0 {
		t.Errorf("resources: peak %v, cpu %v", got["peak_rss_mb"], got["cpu_seconds_per_100k_events"])
	}

	// A run with nothing measured still has every key, as null.
	buf.Reset()
	if err := (&Report{}).WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	got = nil
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	for _, k := range requiredKeys {
		if v, ok := got[k]; !ok || v != nil {
			t.Errorf("empty report: %s = %v (present %v), want null", k, v, ok)
		}
	}
}

func TestMedian(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{9, 1, 5}, 5},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		in := append([]float64(nil), tc.in...)
		if got := median(tc.in); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.want)
		}
		for i := range in {
			if in[i] != tc.in[i] {
				t.Errorf("median reordered its input: %v", tc.in)
			}
		}
	}
}

// TestUnfinishedEventsCountAsLowerBounds: an event with no first step when
// the wait ended must not vanish from the percentiles (that would flatter a
// relay that cannot keep up); it counts with the time waited.
func TestUnfinishedEventsCountAsLowerBounds(t *testing.T) {
	t.Parallel()
	tl := newTimeline(4)
	ms := int64(time.Millisecond)
	for i := range 4 {
		tl.commit[i].Store(1 + int64(i)*ms)
		tl.start[i].Store(1 + int64(i)*ms + 2*ms)
	}
	tl.step[0].Store(1 + 10*ms)
	tl.step[1].Store(1 + 11*ms)
	// Events 2 and 3 never had their first step; the wait ended at 1 s.
	tl.stop.Store(1 + 1000*ms)
	tl.end[0].Store(1 + 20*ms)
	start, step, end, noStart, noStep, noEnd := tl.summaries(0, 4)
	if noStart != 0 || noStep != 2 || noEnd != 3 {
		t.Fatalf("unfinished = %d, %d, %d; want 0, 2, 3", noStart, noStep, noEnd)
	}
	if end.Count != 4 || end.Max != 999 {
		t.Fatalf("end = %+v; want 4 samples, max 999 ms (the wait, from event 1's commit)", end)
	}
	if start.Count != 4 || start.Max != 2 {
		t.Fatalf("start = %+v", start)
	}
	if step.Count != 4 || step.P50 != 10 || step.Max != 998 {
		t.Fatalf("first step = %+v; want 4 samples, p50 10 ms, max 998 ms (the wait)", step)
	}
}
