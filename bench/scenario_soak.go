package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/relay"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/admin"
	"github.com/compensa/compensa/saga/pgjournal"
)

// The soak scenarios hold a steady rate for a long time, so that what grows
// with time shows: table bytes that retention should keep flat, indexes that
// bloat, memory that leaks, a runner that slows as the tables fill.
//
//   - soak: the whole relay (stream, correlator, runner of the three-step
//     bench saga, as the latency scenario wires them) with the retention
//     `relay run` has: --saga-retention (default 2m), --outbox-retention half
//     of it and the shortest dedupe window the relay accepts with them
//     (relay.DedupeFloor, with --resync-margin the other half), so that a
//     finished instance's row and history are gone a retention after it
//     ended. The janitor runs as in `relay run`, every half retention (at
//     most every 30 s).
//   - soak-noretention: the same without retention (--saga-retention 0
//     --dedupe-window 0, no outbox retention): the janitor only folds the
//     status counts, as it does then in `relay run`.
//
// The producer commits Config.SoakSagas triggers (default 1,000,000) open
// loop at a fixed rate: Config.SoakRate, or 75 % of the sustainable rate the
// capacity ramp finds first (findCapacity, once per bench run). Every
// SoakSample interval the bench records the sagas completed, the bytes of the
// relay's tables and this process's RSS.
//
// Figures (per run): the sagas/s completed in each tenth of the producer's
// time and the last tenth's over the first's (throughput ratio); the p99 of
// trigger commit → saga COMPLETED for the triggers of each tenth (by
// sequence); the relay's tables' total bytes at the end over their bytes one
// retention period after the start (for the run without retention, at the
// same time, so the two growths compare); the RSS high-water mark. The relay
// runs in the bench process: its RSS includes the producer and the
// timeline (four 8-byte marks per saga, 32 MB per million).
func (r *run) soakScenario(ctx context.Context) error { return r.soak(ctx, true) }

func (r *run) soakNoRetentionScenario(ctx context.Context) error { return r.soak(ctx, false) }

// soakTables are the tables whose bytes (heap, indexes and TOAST) the soak
// follows: every table the relay writes for sagas and the outbox.
var soakTables = []string{"saga_instances", "saga_steps", "saga_events", "relay_inbox", "relay_dead_letters",
	"relay_sink_skipped", "saga_status_deltas", "outbox"}

const (
	soakDefaultSagas = 1_000_000
	soakQuickSagas   = 20_000
	// soakShare is the share of the sustainable rate held, in percent.
	soakShare = 75
	// soakBuckets is how many points per run the plot's throughput and
	// p99 lines have.
	soakBuckets = 100
)

// soakPlan is what a soak run holds: sizes and the retention flags.
type soakPlan struct {
	sagas                                              int
	sagaRetention, outboxRetention, resyncMargin, keep time.Duration
	sample, drain                                      time.Duration
}

func (r *run) soakPlan(retention bool) soakPlan {
	p := soakPlan{sagas: cmp.Or(r.cfg.SoakSagas, soakDefaultSagas), sagaRetention: cmp.Or(r.cfg.SoakRetention, 2*time.Minute),
		sample: 5 * time.Second, drain: 5 * time.Minute}
	if r.cfg.Quick {
		p.sagas = cmp.Or(r.cfg.SoakSagas, soakQuickSagas)
		p.sagaRetention = cmp.Or(r.cfg.SoakRetention, 10*time.Second)
		p.sample, p.drain = time.Second, time.Minute
	}
	// The reference for the table growth is one retention after the
	// start, in both runs.
	p.keep = p.sagaRetention
	if !retention {
		p.sagaRetention = 0
		return p
	}
	p.outboxRetention = p.sagaRetention / 2
	p.resyncMargin = p.sagaRetention - p.outboxRetention
	return p
}

// dedupeWindow is the shortest the relay accepts with these flags.
func (p soakPlan) dedupeWindow() time.Duration {
	if p.sagaRetention == 0 {
		return 0
	}
	return max(p.sagaRetention, relay.DedupeFloor(p.resyncMargin, p.outboxRetention))
}

// janitorInterval is relay.Config's: half the shortest retention, between
// one second and thirty.
func (p soakPlan) janitorInterval() time.Duration {
	if p.sagaRetention == 0 {
		return 30 * time.Second
	}
	return max(time.Second, min(30*time.Second, p.sagaRetention/2))
}

// command is the `relay run` flags the run's retention stands for.
func (p soakPlan) command() string {
	if p.sagaRetention == 0 {
		return "relay run --saga-retention 0 --dedupe-window 0"
	}
	return fmt.Sprintf("relay run --saga-retention %s --dedupe-window %s --outbox-retention %s --resync-margin %s",
		p.sagaRetention, p.dedupeWindow(), p.outboxRetention, p.resyncMargin)
}

func (r *run) soak(ctx context.Context, retention bool) error {
	if r.report.Soak == nil {
		r.report.Soak = &SoakResult{}
	}
	res := r.report.Soak
	plan := r.soakPlan(retention)
	perSec, err := r.soakRate(ctx, res)
	if err != nil {
		return err
	}
	name := "soak"
	if !retention {
		name = "soak-noretention"
	}
	run, err := r.soakRun(ctx, name, plan, perSec)
	res.Runs = append(res.Runs, run)
	if werr := r.writeSoakFiles(res); werr != nil {
		r.report.Notes = append(r.report.Notes, werr.Error())
	}
	return err
}

// soakRate is the offered rate: Config.SoakRate, or soakShare % of the
// capacity a ramp finds (the capacity scenario's, if it ran before).
func (r *run) soakRate(ctx context.Context, res *SoakResult) (int, error) {
	if r.cfg.SoakRate > 0 {
		res.RateGiven = true
		return r.cfg.SoakRate, nil
	}
	if res.CapacitySagasPerSec == 0 && r.report.Capacity != nil {
		res.CapacitySagasPerSec = r.report.Capacity.SagasPerSec
	}
	if res.CapacitySagasPerSec == 0 {
		r.progress("soak: measuring the sustainable rate first (the capacity scenario's ramp)")
		cr := &CapacityResult{}
		capacity, err := r.findCapacity(ctx, cr)
		res.Ramp = cr.Ramp
		if err != nil {
			return 0, fmt.Errorf("capacity ramp: %w", err)
		}
		res.CapacitySagasPerSec = float64(capacity)
	}
	return max(1, int(math.Round(res.CapacitySagasPerSec*soakShare/100))), nil
}

func (r *run) soakRun(ctx context.Context, name string, plan soakPlan, perSec int) (SoakRun, error) {
	out := SoakRun{Name: name, Retention: plan.sagaRetention > 0, Sagas: plan.sagas, Rate: perSec,
		SagaRetentionSec: plan.sagaRetention.Seconds(), OutboxRetentionSec: plan.outboxRetention.Seconds(),
		DedupeWindowSec: plan.dedupeWindow().Seconds(), ReferenceSec: plan.keep.Seconds(), Command: plan.command(),
		LoadBefore: loadAverage()}
	jcfg := pgjournal.RetentionConfig{History: plan.sagaRetention, DedupeWindow: plan.dedupeWindow(),
		Interval: plan.janitorInterval(), Logger: r.log.With("component", "retention")}
	p, err := r.openPipelineWith(ctx, plan.sagas+1, pipelineOptions{OutboxRetention: plan.outboxRetention, Janitor: &jcfg})
	if err != nil {
		return out, err
	}
	defer p.close()
	// Both runs start from the same empty tables (reset leaves these).
	if _, err := r.env.pool.Exec(ctx, `TRUNCATE saga_status_deltas, relay_sink_skipped`); err != nil {
		return out, fmt.Errorf("empty the status deltas: %w", err)
	}
	r.progress("%s: %d sagas at %d sagas/s (about %s), as `%s`", name, plan.sagas, perSec,
		(time.Duration(plan.sagas/perSec) * time.Second).String(), plan.command())
	meter := startSelfMeter()
	tl := p.tl
	began := time.Since(tl.base)
	smp := &soakSampler{pool: r.env.pool, ended: func() int64 { return p.ended.Load() - 1 }, began: tl.base.Add(began)}
	smp.take(ctx)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(plan.sample)
		defer tick.Stop()
		lastLog := time.Now()
		for {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
				s := smp.take(ctx)
				if time.Since(lastLog) >= time.Minute || r.cfg.Quick && time.Since(lastLog) >= 10*time.Second {
					lastLog = time.Now()
					r.progress("%s: %s: %d of %d sagas completed, tables %.1f MB, RSS %.0f MB, load %.2f",
						name, time.Duration(s.T*float64(time.Second)).Round(time.Second), s.Completed, plan.sagas, float64(s.TableBytes)/(1<<20), s.RSSMB, s.Load)
				}
			}
		}
	}()
	prodErr := p.prod.produce(ctx, 1, plan.sagas, perSec)
	produced := time.Since(tl.base)
	complete := false
	if prodErr == nil {
		complete, err = tl.wait(ctx, tl.end, 1, plan.sagas, plan.drain, p.streamErr)
	}
	close(stop)
	wg.Wait()
	if prodErr != nil {
		return out, prodErr
	}
	if err != nil {
		return out, err
	}
	smp.take(ctx) // the end
	out.TableBytesEndByTable = tableSizes(ctx, r.env.pool)
	usage := meter.stop()

	commit, end := make([]int64, plan.sagas), make([]int64, plan.sagas)
	for i := range plan.sagas {
		commit[i], end[i] = tl.commit[i+1].Load(), tl.end[i+1].Load()
	}
	stopAt := tl.stop.Load()
	if stopAt == 0 {
		stopAt = int64(time.Since(tl.base)) + 1
	}
	from, to := int64(began)+1, int64(produced)+1
	out.Seconds = time.Duration(to - from).Seconds()
	out.AchievedRate = rate(plan.sagas, time.Duration(to-from))
	out.TenthSagasPerSec = rateBuckets(end, from, to, 10)
	out.TenthEndP99Ms = f64s(latencyBuckets(commit, end, 10, stopAt, 0.99))
	out.ThroughputRatio = f64(lastOverFirst(out.TenthSagasPerSec))
	var all []time.Duration
	for i := range commit {
		if commit[i] == 0 {
			continue
		}
		e := end[i]
		if e == 0 {
			out.EndUnfinished++
			e = stopAt
		}
		all = append(all, time.Duration(max(0, e-commit[i])))
	}
	out.End = summarize(all)
	out.Samples = smp.samples
	out.TableBytesAtReference, out.TableBytesEnd, out.TableBytesGrowth = tableGrowth(out.Samples, plan.keep)
	_, _, out.TableBytesGrowthFromTenth = tableGrowth(out.Samples, time.Duration(out.Seconds*float64(time.Second)/10))
	out.RSSMBMax = usage.PeakRSSMB()
	for _, s := range out.Samples {
		out.RSSMBMax = max(out.RSSMBMax, s.RSSMB)
		out.LoadMax = max(out.LoadMax, s.Load)
	}
	out.CPUSeconds = usage.CPU.Seconds()
	out.Buckets = soakBucketsOf(commit, end, from, to, stopAt, soakBuckets)
	out.LoadAfter = loadAverage()
	if !complete {
		r.progress("%s: %d sagas had not ended %s after the producer stopped; they count with the time waited (a lower bound)",
			name, out.EndUnfinished, plan.drain)
	}
	r.progress("%s: %.0f sagas/s achieved; sagas/s per tenth %s (last/first %.2f); end p99 ms per tenth %s; tables %.1f MB at %s, %.1f MB at the end (%s); RSS max %.0f MB",
		name, out.AchievedRate, roundAll(out.TenthSagasPerSec, 0), deref(out.ThroughputRatio), roundAll(derefAll(out.TenthEndP99Ms), 1),
		float64(out.TableBytesAtReference)/(1<<20), plan.keep, float64(out.TableBytesEnd)/(1<<20), fmtGrowth(out.TableBytesGrowth), out.RSSMBMax)
	return out, nil
}

// soakSampler records the soak's time series.
type soakSampler struct {
	pool    *pgxpool.Pool
	ended   func() int64
	began   time.Time
	samples []SoakSample
}

func (s *soakSampler) take(ctx context.Context) SoakSample {
	x := SoakSample{T: time.Since(s.began).Seconds(), Completed: s.ended(), Load: loadAverage(),
		RSSMB: float64(procStatusBytes("/proc/self/status", "VmRSS:")) / (1 << 20)}
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := s.pool.QueryRow(qctx, sqlSoakTableBytes, soakTables).Scan(&x.TableBytes); err != nil {
		x.TableBytes = -1 // not measured: the growth skips it
	}
	_ = s.pool.QueryRow(qctx, sqlSoakRows, soakTables).Scan(&x.InstanceRows, &x.LiveRows, &x.DeadRows, &x.Autovacuums)
	s.samples = append(s.samples, x)
	return x
}

// sqlSoakTableBytes is the total size (heap, indexes, TOAST) of the tables
// named, those that exist.
const sqlSoakTableBytes = `SELECT coalesce(sum(pg_total_relation_size(to_regclass(t))), 0)::bigint FROM unnest($1::text[]) AS t`

// sqlSoakRows reads the statistics' estimates of live rows (saga_instances,
// then all the tables named), dead rows and autovacuum runs: what says
// whether the janitor deletes and the space is reused.
const sqlSoakRows = `
SELECT coalesce(sum(n_live_tup) FILTER (WHERE relname = 'saga_instances'), 0)::bigint, coalesce(sum(n_live_tup), 0)::bigint,
       coalesce(sum(n_dead_tup), 0)::bigint, coalesce(sum(autovacuum_count), 0)::bigint
FROM pg_stat_user_tables WHERE relname = ANY($1::text[])`

// sqlSoakTableSizes is each table's total size.
const sqlSoakTableSizes = `SELECT t, coalesce(pg_total_relation_size(to_regclass(t)), 0) FROM unnest($1::text[]) AS t`

func tableSizes(ctx context.Context, pool *pgxpool.Pool) map[string]int64 {
	out := map[string]int64{}
	rows, err := pool.Query(ctx, sqlSoakTableSizes, soakTables)
	if err != nil {
		return nil
	}
	defer rows.Close()
	for rows.Next() {
		var t string
		var n int64
		if rows.Scan(&t, &n) == nil {
			out[t] = n
		}
	}
	return out
}

// startJanitor runs the retention janitor with the status-count compaction,
// as `relay run` does; stop waits for it after ctx ended.
func startJanitor(ctx context.Context, pool *pgxpool.Pool, journal *pgjournal.Journal, reg *saga.Registry, cfg pgjournal.RetentionConfig) (stop func(), err error) {
	adm, err := admin.New(admin.Config{Pool: pool, Journal: journal, Registry: reg})
	if err != nil {
		return nil, err
	}
	cfg.CompactCounts = adm.CompactCounts
	ret, err := pgjournal.NewRetention(pool, cfg)
	if err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		ret.Run(ctx)
	}()
	return func() { <-done }, nil
}

// rateBuckets splits [from, to) into k equal windows and returns, for each,
// the marks of ts (nanoseconds on the timeline, 0: none) inside it per
// second.
func rateBuckets(ts []int64, from, to int64, k int) []float64 {
	out := make([]float64, k)
	if to <= from || k == 0 {
		return out
	}
	width := float64(to-from) / float64(k)
	for _, t := range ts {
		if t == 0 || t < from || t >= to {
			continue
		}
		out[min(k-1, int(float64(t-from)/width))]++
	}
	for i := range out {
		out[i] /= width / float64(time.Second)
	}
	return out
}

// latencyBuckets splits the events into k consecutive groups by sequence
// and returns each group's percentile p of end - commit in milliseconds. An
// event without a commit is skipped; one without an end counts with stop -
// commit (a lower bound). A group with no event is NaN.
func latencyBuckets(commit, end []int64, k int, stop int64, p float64) []float64 {
	out := make([]float64, k)
	n := len(commit)
	for b := range k {
		lo, hi := b*n/k, (b+1)*n/k
		var d []time.Duration
		for i := lo; i < hi; i++ {
			if commit[i] == 0 {
				continue
			}
			e := end[i]
			if e == 0 {
				e = stop
			}
			d = append(d, time.Duration(max(0, e-commit[i])))
		}
		if len(d) == 0 {
			out[b] = math.NaN()
			continue
		}
		slices.Sort(d)
		out[b] = ms(percentile(d, p))
	}
	return out
}

// lastOverFirst is v's last value over its first (NaN when the first is 0).
func lastOverFirst(v []float64) float64 {
	if len(v) == 0 || v[0] == 0 {
		return math.NaN()
	}
	return v[len(v)-1] / v[0]
}

// tableGrowth returns the table bytes of the first sample taken at or
// after ref, of the last sample, and the last over the first (nil when the
// run was shorter than ref or a size is missing).
func tableGrowth(samples []SoakSample, ref time.Duration) (atRef, atEnd int64, growth *float64) {
	if len(samples) == 0 {
		return 0, 0, nil
	}
	atEnd = samples[len(samples)-1].TableBytes
	i := slices.IndexFunc(samples, func(s SoakSample) bool { return s.T >= ref.Seconds() })
	if i < 0 || i == len(samples)-1 {
		return 0, atEnd, nil
	}
	atRef = samples[i].TableBytes
	if atRef <= 0 || atEnd < 0 {
		return atRef, atEnd, nil
	}
	return atRef, atEnd, f64(float64(atEnd) / float64(atRef))
}

// soakBucketsOf is the plot's throughput and p99 lines: k windows of the
// producer's time [from, to); a window's p99 is over the triggers committed
// in it.
func soakBucketsOf(commit, end []int64, from, to, stop int64, k int) []SoakBucket {
	rates := rateBuckets(end, from, to, k)
	width := float64(to-from) / float64(k)
	groups := make([][]time.Duration, k)
	for i, c := range commit {
		if c == 0 || c < from || c >= to {
			continue
		}
		e := end[i]
		if e == 0 {
			e = stop
		}
		b := min(k-1, int(float64(c-from)/width))
		groups[b] = append(groups[b], time.Duration(max(0, e-c)))
	}
	out := make([]SoakBucket, k)
	for b := range k {
		out[b] = SoakBucket{T: (float64(b) + 0.5) * width / float64(time.Second), SagasPerSec: rates[b]}
		if len(groups[b]) > 0 {
			slices.Sort(groups[b])
			out[b].EndP99Ms = f64(ms(percentile(groups[b], 0.99)))
		}
	}
	return out
}

// f64s is v with NaN as nil (JSON has no NaN).
func f64s(v []float64) []*float64 {
	out := make([]*float64, len(v))
	for i, x := range v {
		out[i] = f64(x)
	}
	return out
}

func deref(v *float64) float64 {
	if v == nil {
		return math.NaN()
	}
	return *v
}

func derefAll(v []*float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = deref(x)
	}
	return out
}

func roundAll(v []float64, digits int) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprintf("%.*f", digits, x)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func fmtGrowth(g *float64) string {
	if g == nil {
		return "growth not measured: the run was shorter than the reference time"
	}
	return fmt.Sprintf("×%.2f", *g)
}

// writeSoakFiles writes the plot (Config.SoakPlot, default soak.svg) and,
// beside it, the soak's results with their series (.json), after each run so
// that a later failure keeps what was measured.
func (r *run) writeSoakFiles(res *SoakResult) error {
	path := cmp.Or(r.cfg.SoakPlot, "soak.svg")
	if dir := filepath.Dir(path); dir != "." {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("soak plot: %w", err)
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("soak plot: %w", err)
	}
	if err := writeSoakPlot(f, res.Runs); err != nil {
		f.Close()
		return fmt.Errorf("soak plot: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("soak plot: %w", err)
	}
	res.Plot = path
	b, err := json.MarshalIndent(res, "", " ")
	if err != nil {
		return fmt.Errorf("soak results: %w", err)
	}
	jpath := strings.TrimSuffix(path, filepath.Ext(path)) + ".json"
	if err := os.WriteFile(jpath, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("soak results: %w", err)
	}
	r.progress("soak: plot written to %s, series to %s", path, jpath)
	return nil
}
