package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/compensa/compensa/internal/briefs"
	"github.com/compensa/compensa/internal/cliflag"
	"github.com/compensa/compensa/internal/pgcluster"
	"github.com/compensa/compensa/migrations"
	"github.com/compensa/compensa/relay"
)

// demoTenant owns the demo's briefs, so that they are easy to find in the
// monitor next to other data of an external server.
var demoTenant = uuid.MustParse("d3e0d3e0-0000-4000-8000-00000000de70")

// Test seams: how the demo gets its PostgreSQL, and a look at the database
// once the summary is printed (before it is removed).
var (
	startDemoCluster = pgcluster.Start
	demoSummarized   func(ctx context.Context, pool *pgxpool.Pool, s demoSummary)
)

type demoOptions struct {
	briefs       int
	fail         int
	exitWhenDone bool
	timeout      time.Duration
	workers      int
	apiToken     string
}

func newDemoCmd(opts *rootOptions) *cobra.Command {
	var d demoOptions
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the research brief demo on a throwaway PostgreSQL",
		Long: "Starts a throwaway PostgreSQL (local binaries, or RELAY_TEST_DATABASE_URL), applies the\n" +
			"schema with the example application, starts the relay (stream, correlator, step\n" +
			"runner, monitor), writes --briefs research briefs each in an application transaction\n" +
			"with its outbox row (--fail of them marked [fail-score], so that their sagas\n" +
			"compensate), shows the sagas' progress and prints a summary. It then serves the\n" +
			"monitor until Ctrl-C, or exits with --exit-when-done: 0 when every saga ended as\n" +
			"expected, 1 otherwise. The cluster is removed on exit.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if d.fail > d.briefs {
				return exitError{code: 2, msg: fmt.Sprintf("--fail must be between 0 and --briefs (%d), got %d", d.briefs, d.fail)}
			}
			// The demo's screen is the progress bar and the summary: the
			// relay's own logs stay quiet unless asked for.
			if f := cmd.Flag("log-level"); f != nil && !f.Changed && os.Getenv("RELAY_LOG_LEVEL") == "" {
				// The compensations the demo provokes are logged as warnings;
				// on this screen the summary tells them.
				opts.logLevel = "error"
			}
			// A new user's `make demo` should not fail because something
			// else holds the default port: without an explicit address the
			// demo takes a free one (it prints the URL).
			if f := cmd.Flag("http-addr"); f != nil && !f.Changed && os.Getenv("RELAY_HTTP_ADDR") == "" {
				if ln, err := net.Listen("tcp", opts.HTTPAddr); err != nil {
					opts.HTTPAddr = "127.0.0.1:0"
				} else {
					ln.Close()
				}
			}
			return runDemo(cmd.Context(), d, opts, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	opts.bindTo(f, "http-addr", "log-level")
	f.Var(cliflag.IntAtLeast(&d.briefs, 200, 1), "briefs", "research briefs to write (env RELAY_BRIEFS)")
	f.Var(cliflag.IntAtLeast(&d.fail, 8, 0), "fail", "how many of them carry [fail-score] and compensate (env RELAY_FAIL)")
	f.BoolVar(&d.exitWhenDone, "exit-when-done", false, "exit once every saga has ended instead of serving the monitor until Ctrl-C (env RELAY_EXIT_WHEN_DONE)")
	f.Var(cliflag.PositiveDuration(&d.timeout, 3*time.Minute), "timeout", "with --exit-when-done, give up (exit 1) when the sagas have not all ended after this long (env RELAY_TIMEOUT)")
	f.Var(cliflag.IntAtLeast(&d.workers, 8, 1), "workers", "step workers (env RELAY_WORKERS)")
	f.StringVar(&d.apiToken, "api-token", "", "token for the monitor's retry and cancel (env RELAY_API_TOKEN); default: a random one, printed")
	return cmd
}

// runDemo is the whole demo; stdout gets the summary, stderr the progress.
func runDemo(ctx context.Context, d demoOptions, opts *rootOptions, stdout, stderr io.Writer) (err error) {
	log := newLogger(opts)
	// Ctrl-C at any point stops the demo and removes what it made; with
	// --exit-when-done it also means the demo did not finish.
	interrupted := func() error {
		if d.exitWhenDone {
			return exitError{code: 130, msg: "interrupted before the sagas ended"}
		}
		fmt.Fprintln(stderr, "interrupted")
		return nil
	}
	fmt.Fprintln(stderr, "starting a throwaway PostgreSQL ...")
	cluster, err := startDemoCluster(ctx, pgcluster.Options{})
	if err != nil {
		if ctx.Err() != nil {
			return interrupted()
		}
		if errors.Is(err, pgcluster.ErrNoPostgres) {
			return exitError{code: 1, msg: pgcluster.InstallHint}
		}
		return exitError{code: 1, msg: fmt.Sprintf("cannot start PostgreSQL: %v; %s", err, pgcluster.InstallHint)}
	}
	defer func() {
		if serr := cluster.Stop(); serr != nil && err == nil {
			err = fmt.Errorf("stop PostgreSQL: %w", serr)
		}
	}()

	db, err := newDemoDatabase(ctx, cluster)
	if err != nil {
		return exitError{code: 1, msg: err.Error()}
	}
	defer db.drop()

	pool, err := pgxpool.New(ctx, db.url)
	if err != nil {
		return exitError{code: 1, msg: fmt.Sprintf("connect to the demo database: %v", err)}
	}
	defer pool.Close()
	if _, err := migrations.Apply(ctx, pool, migrations.Options{WithExamples: true}); err != nil {
		return exitError{code: 1, msg: err.Error()}
	}

	if d.apiToken == "" {
		// A throwaway token for a throwaway relay: printed below, so that
		// the user can retry a FAILED brief from the monitor.
		d.apiToken = strings.ReplaceAll(uuid.NewString(), "-", "")
	}
	reg, err := newRegistry(true)
	if err != nil {
		return exitError{code: 1, msg: err.Error()}
	}
	a, err := relay.New(ctx, relay.Config{
		Registry:      reg,
		DatabaseURL:   db.url,
		Slot:          db.slot,
		Publication:   db.publication,
		HTTPAddr:      opts.HTTPAddr,
		OutboxTable:   "outbox",
		Workers:       d.workers,
		LeaseDuration: 30 * time.Second,
		// A FAILED brief should show up as stuck while the user watches.
		StuckAfter: 10 * time.Second,
		APIToken:   d.apiToken,
		Logger:     log,
	})
	if err != nil {
		return exitError{code: 2, msg: err.Error()}
	}
	if err := a.Start(ctx); err != nil {
		return exitError{code: 2, msg: err.Error()}
	}
	stopped := false
	stopApp := func() error {
		if stopped {
			return nil
		}
		stopped = true
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return a.Stop(sctx)
	}
	defer func() {
		if serr := stopApp(); serr != nil && err == nil {
			err = fmt.Errorf("stop relay: %w", serr)
		}
	}()
	monitor := "http://" + a.Addr() + "/"

	fmt.Fprintf(stderr, "relay running; writing %d research briefs (%d marked %s) ...\n", d.briefs, d.fail, briefs.FailScoreMarker)
	wrote := time.Now()
	if err := writeDemoBriefs(ctx, pool, d.briefs, d.fail); err != nil {
		if ctx.Err() != nil {
			return interrupted()
		}
		return exitError{code: 1, msg: err.Error()}
	}
	log.Info("briefs written", "count", d.briefs, "took", time.Since(wrote))

	waitCtx := ctx
	if d.exitWhenDone {
		var cancel context.CancelFunc
		waitCtx, cancel = context.WithTimeout(ctx, d.timeout)
		defer cancel()
	}
	waitErr := watchProgress(waitCtx, pool, a, d.briefs, stderr)
	if ctx.Err() != nil {
		return interrupted()
	}

	sum, err := readDemoSummary(context.WithoutCancel(ctx), pool)
	if err != nil {
		return exitError{code: 1, msg: err.Error()}
	}
	printDemoSummary(stdout, sum, d, monitor, db.url, db.slot)
	if demoSummarized != nil {
		demoSummarized(ctx, pool, sum)
	}
	if waitErr != nil {
		return exitError{code: 1, msg: waitErr.Error()}
	}
	mismatch := sum.mismatch(d)
	if d.exitWhenDone {
		if mismatch != "" {
			return exitError{code: 1, msg: "demo: the summary does not match what was expected: " + mismatch}
		}
		return nil
	}
	if mismatch != "" {
		fmt.Fprintln(stderr, "warning: "+mismatch)
	}
	fmt.Fprintf(stderr, "\nThe relay keeps running: open %s, edit a brief (see docs/getting-started.md), press Ctrl-C to stop.\n", monitor)
	select {
	case <-ctx.Done():
		fmt.Fprintln(stderr, "stopping ...")
	case <-a.Done():
		if serr := a.Err(); serr != nil && !errors.Is(serr, context.Canceled) {
			return exitError{code: 1, msg: "replication stream stopped: " + serr.Error()}
		}
	}
	return nil
}

// demoDatabase is the database the demo runs in: a fresh one, so that an
// external server's other databases (RELAY_TEST_DATABASE_URL) are not
// touched, and so that its slot and publication names cannot collide.
type demoDatabase struct {
	cluster           *pgcluster.Cluster
	name, url         string
	slot, publication string
}

func newDemoDatabase(ctx context.Context, c *pgcluster.Cluster) (*demoDatabase, error) {
	name := fmt.Sprintf("compensa_demo_%d_%d", os.Getpid(), time.Now().UnixNano()%1_000_000)
	admin, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		return nil, fmt.Errorf("connect to the demo PostgreSQL: %v", err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return nil, fmt.Errorf("create the demo database: %v", err)
	}
	return &demoDatabase{cluster: c, name: name, url: c.DSN(name), slot: name, publication: name + "_pub"}, nil
}

// drop removes the database and its slot. A local cluster is removed whole
// anyway; an external server must be left as it was.
func (db *demoDatabase) drop() {
	if db.cluster.Kind != pgcluster.KindExternal {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, db.cluster.URL)
	if err != nil {
		return
	}
	defer admin.Close(ctx)
	admin.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, db.slot)
	for range 50 {
		if _, err := admin.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, db.slot); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	admin.Exec(ctx, "DROP DATABASE IF EXISTS "+db.name+" WITH (FORCE)")
}

// writeDemoBriefs writes n briefs, each in its own application transaction
// with its outbox row, as an application would. The fail ones are spread
// evenly and carry briefs.FailScoreMarker.
func writeDemoBriefs(ctx context.Context, pool *pgxpool.Pool, n, fail int) error {
	for i := range n {
		title, body := briefs.Sample(i)
		if failsAt(i, n, fail) {
			title = briefs.FailScoreMarker + " " + title
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := briefs.Create(ctx, tx, demoTenant, title, body)
			return err
		})
		if err != nil {
			return fmt.Errorf("write brief %d: %w", i+1, err)
		}
	}
	return nil
}

// failsAt reports whether brief i of n is one of the fail that fail: exactly
// fail of them, evenly spread.
func failsAt(i, n, fail int) bool { return (i+1)*fail/n != i*fail/n }

// demoProgress is where the demo's sagas stand.
type demoProgress struct {
	started, completed, compensated, failed, timedOut int
}

func (p demoProgress) terminal() int { return p.completed + p.compensated + p.failed + p.timedOut }

const demoProgressSQL = `SELECT count(*),
	count(*) FILTER (WHERE status = 'COMPLETED'),
	count(*) FILTER (WHERE status = 'COMPENSATED'),
	count(*) FILTER (WHERE status = 'FAILED'),
	count(*) FILTER (WHERE status = 'TIMED_OUT')
	FROM saga_instances WHERE saga_name = $1 AND saga_version = $2`

func readDemoProgress(ctx context.Context, pool *pgxpool.Pool) (demoProgress, error) {
	var p demoProgress
	err := pool.QueryRow(ctx, demoProgressSQL, briefs.SagaName, briefs.SagaVersion).
		Scan(&p.started, &p.completed, &p.compensated, &p.failed, &p.timedOut)
	return p, err
}

// watchProgress draws the progress until all n sagas have ended, ctx ends
// (an error), or the relay's stream stops on its own.
func watchProgress(ctx context.Context, pool *pgxpool.Pool, a *relay.Relay, n int, w io.Writer) error {
	tty := isTerminal(w)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last demoProgress
	lastPrint := time.Time{}
	for {
		p, err := readDemoProgress(ctx, pool)
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("read progress: %w", err)
		}
		if err == nil {
			done := p.terminal() >= n
			switch {
			case tty:
				fmt.Fprintf(w, "\r%s", progressLine(p, n))
				if done {
					fmt.Fprintln(w)
				}
			case done || (p != last && time.Since(lastPrint) >= time.Second):
				// Not a terminal (a log file, CI): a plain line now and
				// then instead of carriage returns.
				fmt.Fprintln(w, progressLine(p, n))
				lastPrint = time.Now()
			}
			last = p
			if done {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			if tty {
				fmt.Fprintln(w)
			}
			return fmt.Errorf("only %d of %d sagas ended in time (%s)", last.terminal(), n, progressLine(last, n))
		case <-a.Done():
			return fmt.Errorf("the replication stream stopped: %v", a.Err())
		case <-tick.C:
		}
	}
}

// progressLine renders a bar of the ended sagas and the counts.
func progressLine(p demoProgress, n int) string {
	const width = 30
	filled := min(width, p.terminal()*width/max(n, 1))
	return fmt.Sprintf("[%s%s] %d/%d ended  started %d  completed %d  compensated %d  failed %d",
		strings.Repeat("#", filled), strings.Repeat(".", width-filled),
		p.terminal(), n, p.started, p.completed, p.compensated, p.failed)
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// demoSummary is what the demo reports, read from the database.
type demoSummary struct {
	demoProgress
	running int
	// p50 and p99 of the time from the brief's commit (its outbox row's
	// created_at, the transaction's start, which for these one-statement
	// transactions is the commit to within a millisecond) to the saga's
	// terminal state (completed_at), over the ended sagas.
	p50, p99 time.Duration
	// The briefs, by status.
	enriched, draft, enriching int
	// Outbox rows the sagas emitted.
	enrichedEvents, revertedEvents int
}

const demoSummarySQL = `
WITH i AS (
	SELECT i.status, extract(epoch FROM i.completed_at - o.created_at) * 1000 AS ms
	FROM saga_instances i JOIN outbox o ON o.id = i.trigger_event_id
	WHERE i.saga_name = $1 AND i.saga_version = $2
)
SELECT
	count(*) FILTER (WHERE status IN ('RUNNING', 'COMPENSATING')),
	coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) FILTER (WHERE ms IS NOT NULL), 0),
	coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms) FILTER (WHERE ms IS NOT NULL), 0),
	(SELECT count(*) FROM research_briefs WHERE tenant_id = $3 AND status = 'ENRICHED'),
	(SELECT count(*) FROM research_briefs WHERE tenant_id = $3 AND status = 'DRAFT'),
	(SELECT count(*) FROM research_briefs WHERE tenant_id = $3 AND status = 'ENRICHING'),
	(SELECT count(*) FROM outbox WHERE event_type = $4),
	(SELECT count(*) FROM outbox WHERE event_type = $5)
FROM i`

func readDemoSummary(ctx context.Context, pool *pgxpool.Pool) (demoSummary, error) {
	var s demoSummary
	p, err := readDemoProgress(ctx, pool)
	if err != nil {
		return s, fmt.Errorf("read summary: %w", err)
	}
	s.demoProgress = p
	var p50, p99 float64
	err = pool.QueryRow(ctx, demoSummarySQL, briefs.SagaName, briefs.SagaVersion, demoTenant,
		briefs.EventEnriched, briefs.EventEnrichmentReverted).
		Scan(&s.running, &p50, &p99, &s.enriched, &s.draft, &s.enriching, &s.enrichedEvents, &s.revertedEvents)
	if err != nil {
		return s, fmt.Errorf("read summary: %w", err)
	}
	s.p50 = time.Duration(p50 * float64(time.Millisecond))
	s.p99 = time.Duration(p99 * float64(time.Millisecond))
	return s, nil
}

// mismatch says how the summary differs from what the demo wrote: every
// brief's saga ended, the marked ones compensated, the others completed, and
// the briefs' rows agree. Empty when all is as expected.
func (s demoSummary) mismatch(d demoOptions) string {
	var bad []string
	check := func(what string, got, want int) {
		if got != want {
			bad = append(bad, fmt.Sprintf("%s %d, want %d", what, got, want))
		}
	}
	ok := d.briefs - d.fail
	check("sagas started", s.started, d.briefs)
	check("sagas ended", s.terminal(), d.briefs)
	check("completed", s.completed, ok)
	check("compensated", s.compensated, d.fail)
	check("briefs ENRICHED", s.enriched, ok)
	check("briefs back in DRAFT", s.draft, d.fail)
	check(briefs.EventEnriched+" events", s.enrichedEvents, ok)
	return strings.Join(bad, "; ")
}

func printDemoSummary(w io.Writer, s demoSummary, d demoOptions, monitor, dbURL, slot string) {
	fmt.Fprintf(w, "\nbrief_enrichment: %d briefs written, %d of them marked %s\n\n", d.briefs, d.fail, briefs.FailScoreMarker)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(tw, "  %s\t%8v\n", k, v) }
	row("sagas started", s.started)
	row("completed", s.completed)
	row("compensated", s.compensated)
	row("failed", s.failed)
	if s.timedOut > 0 {
		row("timed out", s.timedOut)
	}
	if s.running > 0 {
		row("still running", s.running)
	}
	row("p50 commit → end", s.p50.Round(time.Millisecond))
	row("p99 commit → end", s.p99.Round(time.Millisecond))
	row("briefs ENRICHED", s.enriched)
	row("briefs back in DRAFT", s.draft)
	row(briefs.EventEnriched, s.enrichedEvents)
	row(briefs.EventEnrichmentReverted, s.revertedEvents)
	tw.Flush()
	if d.exitWhenDone {
		// The cluster, the relay and the monitor are removed on exit:
		// nothing here would still answer.
		return
	}
	fmt.Fprintf(w, "\nmonitor:   %s (API token %s)\n", monitor, d.apiToken)
	fmt.Fprintf(w, "database:  %s\n", dbURL)
	fmt.Fprintf(w, "slot:      %s\n", slot)
	// The demo sections of docs/getting-started.md use these variables: one line to paste
	// into another shell.
	fmt.Fprintf(w, "\nin another shell:\n")
	if hint := pathHint(); hint != "" {
		fmt.Fprintf(w, "  %s\n", hint)
	}
	fmt.Fprintf(w, "  export DB='%s' TOKEN='%s' RELAY='%s' SLOT='%s'\n",
		dbURL, d.apiToken, strings.TrimSuffix(monitor, "/"), slot)
	fmt.Fprintf(w, "  relay lag --database-url \"$DB\" --slot \"$SLOT\"\n")
}

// pathHint is the line that puts this binary on PATH for the commands the
// demo suggests (`relay lag`, ...), or "" when `relay` on PATH is already
// this binary. Under `make demo` the binary is bin/relay of the checkout.
func pathHint() string {
	self, err := os.Executable()
	if err != nil {
		return ""
	}
	wd, _ := os.Getwd()
	onPath, _ := exec.LookPath("relay")
	return pathHintFor(self, wd, onPath)
}

func pathHintFor(self, wd, onPath string) string {
	resolve := func(p string) string {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			return r
		}
		return p
	}
	self = resolve(self)
	if onPath != "" && resolve(onPath) == self {
		return ""
	}
	dir := filepath.Dir(self)
	if wd != "" && dir == filepath.Join(wd, "bin") {
		return "export PATH=$PWD/bin:$PATH   # relay is bin/relay here; or: sudo make install"
	}
	return "export PATH='" + dir + "':$PATH   # or: sudo make install"
}
