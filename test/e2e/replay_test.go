package e2e

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

// writeMsgs commits msgs in one transaction.
func writeMsgs(t *testing.T, pool *pgxpool.Pool, msgs ...outbox.Message) {
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Error(err)
		return
	}
	defer tx.Rollback(ctx)
	if err := outbox.Write(ctx, tx, msgs...); err != nil {
		t.Error(err)
		return
	}
	if err := tx.Commit(ctx); err != nil {
		t.Error(err)
	}
}

// hookRecorder is a webhook endpoint that records each delivery's id and
// arrival time.
type hookRecorder struct {
	mu  sync.Mutex
	ids []string
	at  map[string][]time.Time
}

func (h *hookRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("webhook-id")
	h.mu.Lock()
	h.ids = append(h.ids, id)
	h.at[id] = append(h.at[id], time.Now())
	h.mu.Unlock()
	w.WriteHeader(204)
}

// serveHook serves a new hookRecorder on a free port until the test ends
// and returns it with its address.
func serveHook(t *testing.T) (*hookRecorder, net.Addr) {
	t.Helper()
	rec := &hookRecorder{at: map[string][]time.Time{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: rec}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return rec, ln.Addr()
}

func (h *hookRecorder) snapshot() ([]string, map[string]int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := map[string]int{}
	for _, id := range h.ids {
		n[id]++
	}
	return append([]string(nil), h.ids...), n
}

// TestSinksReplay: 10,000 outbox rows already delivered are replayed to a
// webhook sink with `relay sinks replay` while producers write: every row of
// the window is delivered again with its original id, in order per
// aggregate among the replayed deliveries, and live events keep flowing.
// A dry run only counts; rows outside the window or of another aggregate
// type are not replayed.
func TestSinksReplay(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	rec, addr := serveHook(t)
	file := filepath.Join(t.TempDir(), "sinks.yaml")
	os.WriteFile(file, []byte(fmt.Sprintf(`sinks:
  - name: hook
    match: { event_types: ["replay.*"] }
    webhook: { url: "http://%s/events", secret_env: REPLAY_SECRET, timeout: 5s }
`, addr)), 0o600)
	env := []string{"REPLAY_SECRET=whsec_" + base64.StdEncoding.EncodeToString([]byte("replay-test-secret-0123456789"))}
	const apiToken = "5f0c9a1e7b3d4c2a8e6f1b0d9c7a5e3f2b4d6c8a0e1f3b5d7c9a2e4f6b8d0c1a"
	p := relaytest.Start(t, env, relayArgs(db, "--sinks", file, "--api-token", apiToken)...)

	// The window: 10,000 rows over 40 aggregates, in 20 transactions.
	var rows []string
	aggOf := map[string]int{}
	since := time.Now().Add(-time.Second)
	for tx := range 20 {
		var msgs []outbox.Message
		for i := range 500 {
			id := uuid.New()
			a := (tx*500 + i) % 40
			msgs = append(msgs, outbox.Message{ID: id, AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", a),
				EventType: "replay.event", Payload: map[string]int{"n": tx*500 + i}})
			rows = append(rows, id.String())
			aggOf[id.String()] = a
		}
		writeMsgs(t, db.Pool, msgs...)
	}
	// Outside the filter: another aggregate type in the window.
	other := uuid.New()
	writeMsgs(t, db.Pool, outbox.Message{ID: other, AggregateType: "invoice", AggregateID: "i-1", EventType: "replay.event", Payload: map[string]int{}})
	time.Sleep(50 * time.Millisecond)
	until := time.Now()
	testkit.WaitFor(t, 3*time.Minute, "the live delivery of the window", func() bool {
		_, n := rec.snapshot()
		for _, id := range rows {
			if n[id] == 0 {
				return false
			}
		}
		return true
	})
	before, _ := rec.snapshot()
	args := []string{"sinks", "replay", "hook", "--database-url", db.URL, "--sinks", file, "--aggregate-type", "order", "--event-type", "replay.*",
		"--since", since.UTC().Format(time.RFC3339Nano), "--until", until.UTC().Format(time.RFC3339Nano)}
	out, code := relaytest.Run(t, env, append(args, "--dry-run")...)
	if code != 0 || !strings.Contains(out, "sink hook: 10000 rows found (dry run") {
		t.Fatalf("dry run: exit %d\n%s", code, out)
	}
	// The same through the API (operate role, a token for every tenant).
	post := func(path, body string) (int, string) {
		req, _ := http.NewRequest("POST", "http://"+p.Addr+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+apiToken)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	filter := fmt.Sprintf(`"since": %q, "until": %q, "aggregate_type": "order", "event_type": "replay.*"`, since.UTC().Format(time.RFC3339Nano), until.UTC().Format(time.RFC3339Nano))
	if code, body := post("/v1/sinks/hook/replay", "{"+filter+`, "dry_run": true}`); code != 200 || !strings.Contains(body, `"found": 10000`) || !strings.Contains(body, `"delivered": 0`) {
		t.Fatalf("POST /v1/sinks/hook/replay dry run: %d %s", code, body)
	}
	if code, body := post("/v1/sinks/nope/replay", "{"+filter+"}"); code != 404 {
		t.Fatalf("POST /v1/sinks/nope/replay: %d %s, want 404", code, body)
	}
	if _, n := rec.snapshot(); len(n) != len(rows)+1 {
		t.Fatalf("the dry run delivered something")
	}

	// Live producers beside the replay.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var live []string
	var liveMu sync.Mutex
	committedAt := map[string]time.Time{}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id := uuid.New()
			writeMsgs(t, db.Pool, outbox.Message{ID: id, AggregateType: "order", AggregateID: fmt.Sprintf("live-%d", i%5), EventType: "replay.live", Payload: map[string]int{"i": i}})
			liveMu.Lock()
			live = append(live, id.String())
			committedAt[id.String()] = time.Now()
			liveMu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()
	began := time.Now()
	out, code = relaytest.Run(t, env, args...)
	took := time.Since(began)
	close(stop)
	wg.Wait()
	if code != 0 || !strings.Contains(out, "sink hook: 10000 rows found, 10000 delivered") {
		t.Fatalf("replay: exit %d\n%s", code, out)
	}
	testkit.WaitFor(t, time.Minute, "the live events", func() bool {
		_, n := rec.snapshot()
		for _, id := range live {
			if n[id] == 0 {
				return false
			}
		}
		return true
	})
	after, n := rec.snapshot()
	for _, id := range rows {
		if n[id] < 2 {
			t.Fatalf("row %s of the window was not replayed (%d deliveries)", id, n[id])
		}
	}
	if n[other.String()] != 1 {
		t.Errorf("a row of another aggregate type was replayed")
	}
	// Order per aggregate among the replayed deliveries (the ones after
	// the live delivery of the window).
	pos := map[string]int{}
	for i, id := range after[len(before):] {
		if _, ok := aggOf[id]; ok {
			if _, seen := pos[id]; !seen {
				pos[id] = i
			}
		}
	}
	last := map[int]int{}
	for _, id := range rows {
		a := aggOf[id]
		if prev, ok := last[a]; ok && pos[id] < prev {
			t.Fatalf("aggregate o-%d: row %s replayed before a row created earlier", a, id)
		}
		last[a] = pos[id]
	}
	var worst time.Duration
	rec.mu.Lock()
	liveMu.Lock()
	for _, id := range live {
		if d := rec.at[id][0].Sub(committedAt[id]); d > worst {
			worst = d
		}
	}
	liveMu.Unlock()
	rec.mu.Unlock()
	t.Logf("replay of 10000 rows took %s; %d live events during it, the slowest delivered %s after its commit", took.Round(time.Millisecond), len(live), worst.Round(time.Millisecond))
	if worst > took+5*time.Second {
		t.Errorf("a live event waited %s, longer than the replay itself (%s)", worst, took)
	}
	p.Stop(30 * time.Second)
}

// A replay leaves out what an operator skipped for the sink unless asked,
// and runs once at a time per sink: while another holds the sink's replay
// lock, `relay sinks replay` refuses with exit 1 and delivers nothing.
func TestSinksReplaySkipsSkippedAndRunsAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	rec, addr := serveHook(t)
	file := filepath.Join(t.TempDir(), "sinks.yaml")
	writeFile(t, file, fmt.Sprintf("sinks:\n  - name: hook\n    webhook: { url: \"http://%s/events\", secret_env: REPLAY_SECRET, timeout: 5s }\n", addr))
	env := []string{"REPLAY_SECRET=whsec_" + base64.StdEncoding.EncodeToString([]byte("replay-test-secret-0123456789"))}

	since := time.Now().Add(-time.Second)
	var ids []string
	var msgs []outbox.Message
	for i := range 5 {
		id := uuid.New()
		ids = append(ids, id.String())
		msgs = append(msgs, outbox.Message{ID: id, AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", i), EventType: "replay.event", Payload: map[string]int{"n": i}})
	}
	writeMsgs(t, db.Pool, msgs...)
	if _, err := db.Pool.Exec(ctx, `INSERT INTO relay_sink_skipped (sink, event_id, aggregate_key, event, reason, attempts, parked_at, skipped_by, skip_reason)
		VALUES ('hook', $1, 'order/o-0', '{}', 'answered 422', 3, now(), 'test', 'the receiver cannot take it')`, ids[0]); err != nil {
		t.Fatal(err)
	}
	args := []string{"sinks", "replay", "hook", "--database-url", db.URL, "--sinks", file, "--since", since.UTC().Format(time.RFC3339Nano)}

	// Another replay holds the sink's lock.
	holder, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended('compensa-sink-replay:hook', 0))`); err != nil {
		t.Fatal(err)
	}
	out, code := relaytest.Run(t, env, args...)
	if code != 1 || !strings.Contains(out, "already running") {
		t.Fatalf("replay while another runs: exit %d, want 1 naming the running replay\n%s", code, out)
	}
	if got, _ := rec.snapshot(); len(got) != 0 {
		t.Fatalf("the refused replay delivered %d events", len(got))
	}
	holder.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
	holder.Release()

	out, code = relaytest.Run(t, env, args...)
	if code != 0 || !strings.Contains(out, "4 rows found, 4 delivered") || !strings.Contains(out, "1 skipped events left out") {
		t.Fatalf("replay: exit %d, want 4 delivered and the skipped one left out\n%s", code, out)
	}
	if _, n := rec.snapshot(); n[ids[0]] != 0 {
		t.Fatal("the skipped event was replayed")
	}
	out, code = relaytest.Run(t, env, append(args, "--include-skipped")...)
	if code != 0 || !strings.Contains(out, "5 rows found, 5 delivered") {
		t.Fatalf("replay --include-skipped: exit %d\n%s", code, out)
	}
	if _, n := rec.snapshot(); n[ids[0]] != 1 {
		t.Fatalf("--include-skipped delivered the skipped event %d times, want 1", n[ids[0]])
	}
}
