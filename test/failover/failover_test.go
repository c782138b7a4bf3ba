// Package failover runs the relay against a highly available PostgreSQL: a
// primary and a hot standby with slot synchronization (PostgreSQL 17 and
// 18, installed by the harness), the relay given both hosts. The primary is
// killed with -9 and the standby promoted while producers write; the relay
// must follow by itself and lose and double nothing.
package failover

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/compensa/compensa/internal/pgcluster"
	"github.com/compensa/compensa/migrations"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/test/natstest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

var (
	// full: 10 promotions on each version (RELAY_TEST_HEAVY=1, make
	// test-failover) instead of one on 17.
	full     = testkit.Heavy()
	versions = flag.String("failover.versions", "", "comma-separated major versions (default: 17, and 18 with RELAY_TEST_HEAVY=1)")
)

func TestMain(m *testing.M) {
	testkit.SkipSuiteInShort("promotions on PostgreSQL 17 and 18, installed from npm")
	flag.Parse()
	code := m.Run()
	relaytest.Cleanup()
	if code == 0 {
		// pgx's pool health checker may still be winding down after Close.
		if err := goleak.Find(goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func testVersions() []int {
	if *versions != "" {
		var out []int
		for _, s := range regexp.MustCompile(`\d+`).FindAllString(*versions, -1) {
			v, _ := strconv.Atoi(s)
			out = append(out, v)
		}
		return out
	}
	if full {
		return pgcluster.InstallableVersions()
	}
	return []int{17}
}

// TestRelayFollowsPromotion: sagas and a NATS sink under load; the primary
// is killed with -9 and the standby promoted (10 times with
// RELAY_TEST_HEAVY=1, each time a new standby is made from the new primary on
// the old primary's port). The relay follows with no operator action.
// Afterwards, on the last primary: every trigger row started exactly one
// saga, which finished; every outbox row is in the NATS stream (dedupe id =
// row id).
func TestRelayFollowsPromotion(t *testing.T) {
	t.Parallel()
	for _, v := range testVersions() {
		t.Run(fmt.Sprintf("pg%d", v), func(t *testing.T) { testRelayFollowsPromotion(t, v) })
	}
}

func testRelayFollowsPromotion(t *testing.T, version int) {
	promotions := 1
	if full {
		promotions = 10
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	primary, err := pgcluster.Start(ctx, pgcluster.Options{Version: version})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { primary.Stop() })
	setupDatabase(t, ctx, primary)
	standby, err := primary.StartStandby(ctx, pgcluster.StandbyOptions{Slot: "standby0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Stop() })
	url := pgcluster.MultiHostURL("app", primary, standby)

	ns := startNATS(t)
	file := filepath.Join(t.TempDir(), "sinks.yaml")
	os.WriteFile(file, []byte(fmt.Sprintf(`sinks:
  - name: bus
    nats: { url: "%s", stream: OUTBOX, subject: "outbox.{aggregate_type}.{event_type}", timeout: 2s }
`, ns.URL())), 0o600)
	const slot = "relay_failover"
	p := relaytest.Start(t, nil, "--database-url", url, "--slot", slot, "--publication", "relay_failover_pub",
		"--status-interval", "200ms", "--heartbeat-interval", "500ms", "--workers", "4", "--sinks", file)

	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	prod := &producer{pool: pool}
	prod.start(2)
	defer prod.stop()

	type figure struct {
		resume   time.Duration
		replayed int
	}
	var figures []figure
	for round := range promotions {
		waitSynced(t, ctx, standby, slot)
		if round == 0 {
			// What an operator checks before trusting a failover.
			lag := lagJSON(t, url, slot)
			if lag["failover"] != true || lag["synchronized_standby_slots"] != "standby0" || lag["failover_ready"] != true {
				t.Errorf("relay lag --json before the failover: %v; want failover true, synchronized_standby_slots standby0, failover_ready true", lag)
			}
			// The gauge is refreshed in the background (the metrics' gauge
			// interval): it follows the synchronization within one.
			ready := func() bool { return scrape(t, p.Addr, "compensa_slot_failover_ready") == 1 }
			for deadline := time.Now().Add(30 * time.Second); !ready() && time.Now().Before(deadline); {
				time.Sleep(200 * time.Millisecond)
			}
			if v := scrape(t, p.Addr, "compensa_slot_failover_ready"); v != 1 {
				t.Errorf("compensa_slot_failover_ready = %d with a synchronizing standby, want 1", v)
			}
		}
		time.Sleep(time.Duration(1500+round*97%1000) * time.Millisecond)
		replayedBefore := scrape(t, p.Addr, "compensa_batches_replayed_total")
		t.Logf("round %d: kill -9 the primary (port %d), promote the standby (port %d)", round+1, primary.Port, standby.Port)
		oldPort := primary.Port
		primary.Kill()
		if round == 0 {
			// Between the failure and the promotion only a standby is
			// left: the relay waits, and /readyz says why.
			waitReadyz(t, p, `standby \(read-only\)`)
		}
		if err := standby.Promote(ctx); err != nil {
			t.Fatal(err)
		}
		promotedAt := time.Now()
		promoted := standby
		// An event written on the new primary after the promotion: the
		// relay has resumed when its saga has started.
		probe := writeBrief(t, ctx, promoted.DSN("app"))
		deadline := time.Now().Add(2 * time.Minute)
		for !sagaStarted(ctx, promoted.DSN("app"), probe) {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the relay did not resume within 2 minutes of the promotion\n%s", round+1, tail(p.Output()))
			}
			select {
			case <-p.Done():
				t.Fatalf("the relay exited after the promotion: %v\n%s", p.ExitErr(), tail(p.Output()))
			case <-time.After(50 * time.Millisecond):
			}
		}
		resume := time.Since(promotedAt)
		figures = append(figures, figure{resume: resume, replayed: scrape(t, p.Addr, "compensa_batches_replayed_total") - replayedBefore})
		t.Logf("round %d: resumed %s after the promotion", round+1, resume.Round(time.Millisecond))
		primary.Stop()
		primary = promoted
		if round+1 < promotions {
			// The next standby takes the killed primary's port, so that
			// the relay's URL names it.
			standby, err = primary.StartStandby(ctx, pgcluster.StandbyOptions{Slot: fmt.Sprintf("standby%d", round+1), Port: oldPort})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { standby.Stop() })
		}
	}
	time.Sleep(time.Second)
	prod.stop()
	t.Logf("producers: %d transactions committed, %d failed (during the failovers)", prod.ok.Load(), prod.failed.Load())

	triggers, rows, deliveries, distinct, doubled := verify(t, ctx, primary, ns.URL(), p)
	// The last primary has no standby: the relay says so when it resumes.
	lag := lagJSON(t, url, slot)
	if lag["failover"] != true || lag["failover_ready"] != false {
		t.Errorf("relay lag --json on a primary without standby: %v; want failover true, failover_ready false", lag)
	}
	p.Stop(60 * time.Second)
	if out := p.Output(); !regexp.MustCompile(`level=WARN msg="the slot will not survive a promotion[^\n]*synchronized_standby_slots is empty`).MatchString(out) {
		t.Errorf("no warning naming synchronized_standby_slots after the relay resumed on a primary without standby:\n%s", tail(out))
	}
	var resumes []time.Duration
	replayed := 0
	for _, f := range figures {
		resumes = append(resumes, f.resume)
		replayed += f.replayed
	}
	slices.Sort(resumes)
	t.Logf("FIGURES pg%d: %d promotions; time to resume after the promotion median %s, max %s; batches replayed %d; NATS deliveries %d for %d rows (%d again, deduplicated by id); triggers %d; lost = %d; doubled starts = %d",
		version, promotions, resumes[len(resumes)/2].Round(time.Millisecond), resumes[len(resumes)-1].Round(time.Millisecond),
		replayed, deliveries, rows, deliveries-distinct, triggers, 0, doubled)
}

// verify checks, on primary once the load has stopped: every trigger row
// started exactly one saga, which completed; no saga was started by an
// event missing there; every outbox row is in the NATS stream.
func verify(t *testing.T, ctx context.Context, primary *pgcluster.Cluster, natsURL string, p *relaytest.Process) (triggers, rows, deliveries, distinct, doubled int) {
	t.Helper()
	app, err := pgx.Connect(ctx, primary.DSN("app"))
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close(ctx)
	n := func(sql string) int {
		var v int
		if err := app.QueryRow(ctx, sql).Scan(&v); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return v
	}
	triggers = n(`SELECT count(*) FROM outbox WHERE event_type = 'research_brief.created'`)
	deadline := time.Now().Add(3 * time.Minute)
	for {
		open := n(`SELECT count(*) FROM outbox o WHERE o.event_type = 'research_brief.created'
			AND NOT EXISTS (SELECT 1 FROM saga_instances i WHERE i.trigger_event_id = o.id AND i.status = 'COMPLETED')`)
		if open == 0 {
			break
		}
		if time.Now().After(deadline) {
			var states string
			app.QueryRow(ctx, `SELECT coalesce(string_agg(st || ' step ' || step || ': ' || n, '; '), '') FROM (
				SELECT coalesce(i.status::text, 'no instance') AS st, coalesce(i.current_step::text, '-') AS step, count(*) AS n
				FROM outbox o LEFT JOIN saga_instances i ON i.trigger_event_id = o.id
				WHERE o.event_type = 'research_brief.created' AND i.status IS DISTINCT FROM 'COMPLETED'
				GROUP BY 1, 2) x`).Scan(&states)
			t.Fatalf("%d of %d trigger rows have no completed saga 3 minutes after the load stopped: %s\n%s", open, triggers, states, tail(p.Output()))
		}
		time.Sleep(200 * time.Millisecond)
	}
	doubled = n(`SELECT count(*) FROM (SELECT 1 FROM saga_instances GROUP BY trigger_event_id, saga_name HAVING count(*) > 1) d`)
	orphans := n(`SELECT count(*) FROM saga_instances i WHERE NOT EXISTS (SELECT 1 FROM outbox o WHERE o.id = i.trigger_event_id)`)
	if doubled != 0 {
		t.Errorf("%d trigger rows started more than one saga", doubled)
	}
	// A saga whose trigger row is not on the new primary would be an event
	// read from WAL that the standby never had.
	if orphans != 0 {
		t.Errorf("%d sagas were started by events missing on the new primary", orphans)
	}

	var want []string
	ids, err := app.Query(ctx, `SELECT id::text FROM outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for ids.Next() {
		var id string
		ids.Scan(&id)
		want = append(want, id)
	}
	ids.Close()
	var got map[string]int
	deadline = time.Now().Add(3 * time.Minute)
	for {
		got = natsIDs(t, natsURL)
		missing := 0
		for _, id := range want {
			if got[id] == 0 {
				missing++
			}
		}
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d outbox rows on the new primary are not in the NATS stream\n%s", missing, len(want), tail(p.Output()))
		}
		time.Sleep(300 * time.Millisecond)
	}
	for _, c := range got {
		deliveries += c
	}
	return triggers, len(want), deliveries, len(got), doubled
}

// setupDatabase creates the application database with the relay's and the
// example's schema.
func setupDatabase(t *testing.T, ctx context.Context, c *pgcluster.Cluster) {
	t.Helper()
	admin, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE app"); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, c.DSN("app"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := migrations.Apply(ctx, conn, migrations.Options{WithExamples: true}); err != nil {
		t.Fatal(err)
	}
}

// waitSynced waits until the standby holds a synchronized, persistent copy
// of the relay's slot.
func waitSynced(t *testing.T, ctx context.Context, standby *pgcluster.Cluster, slot string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		conn, err := pgx.Connect(ctx, standby.DSN("app"))
		if err == nil {
			var n int
			err = conn.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1 AND synced AND NOT temporary`, slot).Scan(&n)
			conn.Close(ctx)
			if err == nil && n == 1 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the relay's slot was not synchronized to the standby within 2 minutes (last error: %v)", err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// producer writes research briefs with their trigger rows, as an
// application does, through the multi-host URL; commits that fail during a
// failover are counted, not retried.
type producer struct {
	pool       *pgxpool.Pool
	ok, failed atomic.Int64
	quit       chan struct{}
	wg         sync.WaitGroup
	once       sync.Once
}

func (p *producer) start(workers int) {
	p.quit = make(chan struct{})
	for range workers {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for {
				select {
				case <-p.quit:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				err := insertBrief(ctx, p.pool)
				cancel()
				if err != nil {
					p.failed.Add(1)
					time.Sleep(100 * time.Millisecond)
					continue
				}
				p.ok.Add(1)
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
}

func (p *producer) stop() {
	p.once.Do(func() {
		close(p.quit)
		p.wg.Wait()
	})
}

type execer interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

func insertBrief(ctx context.Context, db execer) error {
	_, err := insertBriefID(ctx, db)
	return err
}

func insertBriefID(ctx context.Context, db execer) (uuid.UUID, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return uuid.Nil, err
	}
	defer tx.Rollback(ctx)
	brief, tenant, event := uuid.New(), uuid.New(), uuid.New()
	if _, err := tx.Exec(ctx, `INSERT INTO research_briefs (id, tenant_id, title, body) VALUES ($1, $2, 'Failover study', 'Outbox relays and sagas under a failover.')`,
		brief, tenant); err != nil {
		return uuid.Nil, err
	}
	if err := outbox.Write(ctx, tx, outbox.Message{ID: event, TenantID: tenant, AggregateType: "research_brief",
		AggregateID: brief.String(), EventType: "research_brief.created",
		Payload: map[string]string{"brief_id": brief.String()}}); err != nil {
		return uuid.Nil, err
	}
	return event, tx.Commit(ctx)
}

func writeBrief(t *testing.T, ctx context.Context, dsn string) uuid.UUID {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	id, err := insertBriefID(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func sagaStarted(ctx context.Context, dsn string, event uuid.UUID) bool {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return false
	}
	defer conn.Close(ctx)
	var n int
	conn.QueryRow(ctx, `SELECT count(*) FROM saga_instances WHERE trigger_event_id = $1`, event).Scan(&n)
	return n > 0
}

func lagJSON(t *testing.T, url, slot string) map[string]any {
	t.Helper()
	out, code := relaytest.Run(t, nil, "lag", "--json", "--database-url", url, "--slot", slot)
	var m map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &m) != nil {
		t.Fatalf("relay lag --json: exit %d\n%s", code, out)
	}
	return m
}

func startNATS(t *testing.T) *natstest.Server { return natstest.Start(t) }

// natsIDs counts the messages of the OUTBOX stream by dedupe id.
func natsIDs(t *testing.T, url string) map[string]int {
	t.Helper()
	out := map[string]int{}
	nc, err := nats.Connect(url)
	if err != nil {
		return out
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, "OUTBOX")
	if err != nil {
		return out
	}
	info, err := st.Info(ctx)
	if err != nil {
		return out
	}
	for seq := uint64(1); seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			continue
		}
		out[m.Header.Get(jetstream.MsgIDHeader)]++
	}
	return out
}

var metricLine = regexp.MustCompile(`(?m)^(\w+)(?:\{[^}]*\})? ([0-9.e+-]+)$`)

// scrape reads one counter of the relay's /metrics (0 when absent).
func scrape(t *testing.T, addr, name string) int {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, m := range metricLine.FindAllStringSubmatch(string(b), -1) {
		if m[1] == name {
			f, _ := strconv.ParseFloat(m[2], 64)
			return int(f)
		}
	}
	return 0
}

func tail(s string) string {
	if len(s) > 6000 {
		s = s[len(s)-6000:]
	}
	return s
}

// TestExistingSlotGetsFailover: a slot created without failover (by an
// earlier release) on PostgreSQL 17 has failover on after the relay starts.
func TestExistingSlotGetsFailover(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Options{Version: 17})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop() })
	setupDatabase(t, ctx, c)
	conn, err := pgx.Connect(ctx, c.DSN("app"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	const slot = "relay_old"
	if _, err := conn.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
		t.Fatal(err)
	}
	failover := func() bool {
		var on bool
		if err := conn.QueryRow(ctx, `SELECT failover FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&on); err != nil {
			t.Fatal(err)
		}
		return on
	}
	if failover() {
		t.Fatal("the slot has failover on before the relay started")
	}
	p := relaytest.Start(t, nil, "--database-url", c.DSN("app"), "--slot", slot, "--publication", "relay_old_pub",
		"--status-interval", "200ms", "--heartbeat-interval", "500ms")
	deadline := time.Now().Add(60 * time.Second)
	for !failover() {
		if time.Now().After(deadline) {
			t.Fatalf("the slot has failover off 60 s after the relay started\n%s", tail(p.Output()))
		}
		time.Sleep(100 * time.Millisecond)
	}
	ev := writeBrief(t, ctx, c.DSN("app"))
	for !sagaStarted(ctx, c.DSN("app"), ev) {
		if time.Now().After(deadline) {
			t.Fatalf("the relay does not stream after turning failover on\n%s", tail(p.Output()))
		}
		time.Sleep(100 * time.Millisecond)
	}
	p.Stop(30 * time.Second)
}

// TestStartOnStandbyWaits: a relay started with a URL that leads to a
// standby does not stream from it and does not exit: it waits, and once the
// standby is promoted it starts and streams.
func TestStartOnStandbyWaits(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	primary, err := pgcluster.Start(ctx, pgcluster.Options{Version: 17})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { primary.Stop() })
	setupDatabase(t, ctx, primary)
	standby, err := primary.StartStandby(ctx, pgcluster.StandbyOptions{Slot: "standby0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Stop() })
	ev := writeBrief(t, ctx, primary.DSN("app"))
	waitReplayed(t, ctx, standby, ev)
	primary.Kill()
	p := relaytest.Launch(t, nil, "--database-url", standby.DSN("app"), "--slot", "relay_wait", "--publication", "relay_wait_pub",
		"--status-interval", "200ms", "--heartbeat-interval", "500ms")
	waiting := regexp.MustCompile(`level=WARN msg="connected to a standby \(read-only\): waiting for a primary`)
	for deadline := time.Now().Add(90 * time.Second); !waiting.MatchString(p.Output()); {
		if time.Now().After(deadline) {
			t.Fatalf("no warning that the relay waits for a primary within 90 s:\n%s", tail(p.Output()))
		}
		select {
		case <-p.Done():
			t.Fatalf("the relay exited on a standby: %v\n%s", p.ExitErr(), tail(p.Output()))
		case <-time.After(100 * time.Millisecond):
		}
	}
	// It keeps waiting, and says it is not healthy yet, until a promotion.
	time.Sleep(2 * time.Second)
	if p.Healthy() {
		t.Fatalf("the relay served /healthz before the standby was promoted\n%s", tail(p.Output()))
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	p.WaitHealthy(90 * time.Second)
	deadline := time.Now().Add(90 * time.Second)
	for !sagaStarted(ctx, standby.DSN("app"), ev) {
		if time.Now().After(deadline) {
			t.Fatalf("the relay did not stream from the promoted standby\n%s", tail(p.Output()))
		}
		time.Sleep(100 * time.Millisecond)
	}
	p.Stop(30 * time.Second)
}

// waitReplayed waits until the standby has the event's row.
func waitReplayed(t *testing.T, ctx context.Context, standby *pgcluster.Cluster, ev uuid.UUID) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		conn, err := pgx.Connect(ctx, standby.DSN("app"))
		if err == nil {
			var n int
			conn.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE id = $1`, ev).Scan(&n)
			conn.Close(ctx)
			if n == 1 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the standby did not replay the row within 60 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitReadyz waits until /readyz answers 503 with a body matching reason.
func waitReadyz(t *testing.T, p *relaytest.Process, reason string) {
	t.Helper()
	var body string
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + p.Addr + "/readyz")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
			if resp.StatusCode == 503 && regexp.MustCompile(reason).MatchString(body) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz does not say %q: %s\n%s", reason, body, tail(p.Output()))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestPlannedSwitchover: sagas and a NATS sink under load; the primary is
// shut down cleanly and the standby promoted, the old primary rejoins as a
// standby of the new one, and then the same back. The relay follows both
// switches with no operator action, and nothing is lost or started twice.
func TestPlannedSwitchover(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	a, err := pgcluster.Start(ctx, pgcluster.Options{Version: 17})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Stop() })
	setupDatabase(t, ctx, a)
	b, err := a.StartStandby(ctx, pgcluster.StandbyOptions{Slot: "standby_b"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Stop() })
	url := pgcluster.MultiHostURL("app", a, b)
	ns := startNATS(t)
	file := filepath.Join(t.TempDir(), "sinks.yaml")
	os.WriteFile(file, []byte(fmt.Sprintf(`sinks:
  - name: bus
    nats: { url: "%s", stream: OUTBOX, subject: "outbox.{aggregate_type}.{event_type}", timeout: 2s }
`, ns.URL())), 0o600)
	const slot = "relay_switch"
	p := relaytest.Start(t, nil, "--database-url", url, "--slot", slot, "--publication", "relay_switch_pub",
		"--status-interval", "200ms", "--heartbeat-interval", "500ms", "--workers", "4", "--sinks", file)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	prod := &producer{pool: pool}
	prod.start(2)
	defer prod.stop()

	switchover := func(from, to *cluster, standbySlot string) {
		t.Helper()
		waitSynced(t, ctx, to.c, slot)
		time.Sleep(1500 * time.Millisecond)
		t.Logf("switchover: shut down %s (port %d), promote %s (port %d)", from.name, from.c.Port, to.name, to.c.Port)
		from.c.Shutdown()
		if err := to.c.Promote(ctx); err != nil {
			t.Fatal(err)
		}
		promotedAt := time.Now()
		probe := writeBrief(t, ctx, to.c.DSN("app"))
		deadline := time.Now().Add(2 * time.Minute)
		for !sagaStarted(ctx, to.c.DSN("app"), probe) {
			if time.Now().After(deadline) {
				t.Fatalf("the relay did not resume on %s within 2 minutes\n%s", to.name, tail(p.Output()))
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Logf("switchover to %s: resumed %s after the promotion", to.name, time.Since(promotedAt).Round(time.Millisecond))
		if err := from.c.Rejoin(ctx, to.c, standbySlot); err != nil {
			t.Fatal(err)
		}
	}
	ca, cb := &cluster{"a", a}, &cluster{"b", b}
	switchover(ca, cb, "standby_a")
	switchover(cb, ca, "standby_b2")
	time.Sleep(time.Second)
	prod.stop()
	triggers, rows, deliveries, distinct, doubled := verify(t, ctx, a, ns.URL(), p)
	p.Stop(60 * time.Second)
	t.Logf("FIGURES switchover pg17: 2 switchovers; triggers %d; rows %d; NATS deliveries %d (%d again); lost = 0; doubled starts = %d",
		triggers, rows, deliveries, deliveries-distinct, doubled)
}

type cluster struct {
	name string
	c    *pgcluster.Cluster
}
