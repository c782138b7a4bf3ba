package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// stepsPerProcess is the workload's shape: three trivial durable steps.
const stepsPerProcess = 3

// Result is one run of one system.
type Result struct {
	System      string
	Mode        string
	Processes   int
	Seconds     float64
	ProcPerSec  float64
	StepsPerSec float64
	// End-to-end latency of a process, submit to durable completion (ms).
	P50Ms, P99Ms float64
	// Per process: round trips on the system's own pool, write transactions
	// and WAL bytes cluster-wide.
	RoundTrips, WriteXacts, WALBytes float64
}

// roundTrips counts the round trips a pool makes: each query or exec
// (BEGIN and COMMIT included) and each batch, which pgx pipelines in one.
type roundTrips struct{ n atomic.Int64 }

func (t *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	t.n.Add(1)
	return ctx
}
func (t *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (t *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	t.n.Add(1)
	return ctx
}
func (t *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (t *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// newPool opens a traced pool of size connections.
func newPool(ctx context.Context, dsn string, size int32, rt *roundTrips) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = size
	cfg.ConnConfig.Tracer = rt
	return pgxpool.NewWithConfig(ctx, cfg)
}

// meter brackets a measured interval: counters before, counters after.
type meter struct {
	dsn    string
	rt     *roundTrips
	c0     counters
	rt0    int64
	began  time.Time
	submit []atomic.Int64 // unix nanoseconds per process
	done   []atomic.Int64
}

func newMeter(dsn string, rt *roundTrips, n int) *meter {
	return &meter{dsn: dsn, rt: rt, submit: make([]atomic.Int64, n), done: make([]atomic.Int64, n)}
}

func (m *meter) start(ctx context.Context) error {
	c, err := readCounters(ctx, m.dsn)
	if err != nil {
		return err
	}
	m.c0, m.rt0, m.began = c, m.rt.n.Load(), time.Now()
	return nil
}

// stop ends the interval at the last completion and fills r.
func (m *meter) stop(ctx context.Context, r *Result) error {
	rtN := m.rt.n.Load() - m.rt0
	c1, err := readCounters(ctx, m.dsn)
	if err != nil {
		return err
	}
	n := len(m.done)
	var last int64
	lat := make([]float64, 0, n)
	for i := range m.done {
		d, s := m.done[i].Load(), m.submit[i].Load()
		if d == 0 || s == 0 {
			return fmt.Errorf("process %d never completed (or was never submitted)", i)
		}
		last = max(last, d)
		lat = append(lat, float64(d-s)/1e6)
	}
	took := time.Unix(0, last).Sub(m.began)
	sort.Float64s(lat)
	r.Processes = n
	r.Seconds = took.Seconds()
	r.ProcPerSec = float64(n) / took.Seconds()
	r.StepsPerSec = r.ProcPerSec * stepsPerProcess
	r.P50Ms, r.P99Ms = quantile(lat, 0.50), quantile(lat, 0.99)
	r.RoundTrips = float64(rtN) / float64(n)
	r.WriteXacts = float64(c1.xid-m.c0.xid) / float64(n)
	r.WALBytes = float64(c1.wal-m.c0.wal) / float64(n)
	return nil
}

func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Row is the medians of one system's runs.
type Row struct {
	Result
	Runs []float64 // steps/s of each run
}

func medianOf(sys string, rs []Result) Row {
	pick := func(f func(Result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		return median(v)
	}
	row := Row{Result: Result{System: sys, Mode: rs[0].Mode, Processes: rs[0].Processes}}
	row.Seconds = pick(func(r Result) float64 { return r.Seconds })
	row.ProcPerSec = pick(func(r Result) float64 { return r.ProcPerSec })
	row.StepsPerSec = pick(func(r Result) float64 { return r.StepsPerSec })
	row.P50Ms = pick(func(r Result) float64 { return r.P50Ms })
	row.P99Ms = pick(func(r Result) float64 { return r.P99Ms })
	row.RoundTrips = pick(func(r Result) float64 { return r.RoundTrips })
	row.WriteXacts = pick(func(r Result) float64 { return r.WriteXacts })
	row.WALBytes = pick(func(r Result) float64 { return r.WALBytes })
	for _, r := range rs {
		row.Runs = append(row.Runs, r.StepsPerSec)
	}
	return row
}

// Table is the run's output.
type Table struct {
	N, Repeats         int
	LoadStart, LoadEnd float64
	PostgreSQL         string
	Rows               []Row
}

func (t Table) write(w io.Writer) {
	fmt.Fprintf(w, "\npeers: %d processes × %d trivial durable steps, medians of %d interleaved rounds, PostgreSQL %s, load average %.2f → %.2f\n",
		t.N, stepsPerProcess, t.Repeats, t.PostgreSQL, t.LoadStart, t.LoadEnd)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "system\tprocesses/s\tsteps/s\te2e p50 ms\te2e p99 ms\tround trips/process\twrite xacts/process\tWAL bytes/process\tsteps/s of each round\tmode")
	for _, r := range t.Rows {
		runs := ""
		for i, x := range r.Runs {
			if i > 0 {
				runs += ", "
			}
			runs += fmt.Sprintf("%.0f", x)
		}
		if r.System == "pgbench" {
			fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t-\t-\t%.1f\t%.2f\t%.0f\t%s\t%s\n", r.System, r.ProcPerSec, r.StepsPerSec, r.RoundTrips, r.WriteXacts, r.WALBytes, runs, r.Mode)
			continue
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t%.0f\t%.1f\t%.2f\t%.0f\t%s\t%s\n", r.System, r.ProcPerSec, r.StepsPerSec, r.P50Ms, r.P99Ms, r.RoundTrips, r.WriteXacts, r.WALBytes, runs, r.Mode)
	}
	tw.Flush()
	var comp float64
	for _, r := range t.Rows {
		if r.System == "compensa" {
			comp = r.StepsPerSec
		}
	}
	if comp > 0 {
		for _, r := range t.Rows {
			if r.System != "compensa" && r.StepsPerSec > 0 {
				fmt.Fprintf(w, "compensa ÷ %s: %.2f×\n", r.System, comp/r.StepsPerSec)
			}
		}
	}
}

// summary is the JSON line: steps/s (and the rest) per system.
func (t Table) summary() map[string]any {
	out := map[string]any{"n": t.N, "repeats": t.Repeats, "load_average_start": t.LoadStart, "load_average_end": t.LoadEnd}
	sys := map[string]any{}
	for _, r := range t.Rows {
		sys[r.System] = map[string]any{
			"processes_per_sec": round(r.ProcPerSec), "steps_per_sec": round(r.StepsPerSec),
			"e2e_p50_ms": round(r.P50Ms), "e2e_p99_ms": round(r.P99Ms),
			"round_trips_per_process": round(r.RoundTrips), "write_xacts_per_process": round(r.WriteXacts),
			"wal_bytes_per_process": round(r.WALBytes), "steps_per_sec_runs": r.Runs, "mode": r.Mode,
		}
	}
	out["systems"] = sys
	return out
}

func round(v float64) float64 { return float64(int64(v*100+0.5)) / 100 }
