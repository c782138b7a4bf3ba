package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

// briefHook is a webhook endpoint that records, per brief, the ids
// (webhook-id) its research_brief.created event was delivered under.
type briefHook struct {
	mu    sync.Mutex
	ids   map[string]map[string]int // brief id → webhook-id → deliveries
	bytes int
}

func (h *briefHook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var env struct {
		Payload struct {
			BriefID string `json:"brief_id"`
		} `json:"payload"`
	}
	json.Unmarshal(body, &env)
	h.mu.Lock()
	if h.ids[env.Payload.BriefID] == nil {
		h.ids[env.Payload.BriefID] = map[string]int{}
	}
	h.ids[env.Payload.BriefID][r.Header.Get("webhook-id")]++
	h.mu.Unlock()
	w.WriteHeader(204)
}

func (h *briefHook) snapshot() map[string]map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]map[string]int, len(h.ids))
	for b, ids := range h.ids {
		out[b] = map[string]int{}
		for id, n := range ids {
			out[b][id] = n
		}
	}
	return out
}

// TestMessagesSurviveTwoKills: producers commit 200 transactions that each
// write a brief and emit its research_brief.created event as a logical
// decoding message (half without an id), and roll 50 more back, while the
// relay is killed with SIGKILL twice. Every committed event starts its saga
// exactly once and reaches the webhook sink under one id, the same on
// every delivery (a message without an id keeps the id of its WAL
// position across the replays); the rolled-back ones emit nothing. A
// non-transactional message, one that is not JSON and one without
// event_type, written in the middle, become dead letters while the stream
// goes on. With -short: 40 and 10 transactions.
func TestMessagesSurviveTwoKills(t *testing.T) {
	t.Parallel()
	// The producer's pace keeps it writing while each relay starts,
	// streams and is killed.
	committed, rolledBack, pause := 200, 50, 20*time.Millisecond
	if testing.Short() {
		committed, rolledBack, pause = 40, 10, 80*time.Millisecond
	}
	relaytest.Binary(t)
	began := time.Now()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	hook := &briefHook{ids: map[string]map[string]int{}}
	srv := httptest.NewServer(hook)
	t.Cleanup(srv.Close)
	file := filepath.Join(t.TempDir(), "sinks.yaml")
	if err := os.WriteFile(file, []byte(fmt.Sprintf(`sinks:
  - name: hook
    match: { event_types: ["research_brief.created"] }
    webhook: { url: "%s/events", secret_env: MSG_SECRET, timeout: 5s }
`, srv.URL)), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"MSG_SECRET=whsec_" + base64.StdEncoding.EncodeToString([]byte("message-kill-test-secret-0123"))}
	args := relayArgs(db, "--sinks", file)
	p := relaytest.Start(t, env, args...)
	// A message lives in the WAL only: one committed before the relay's
	// slot first existed is not there to read (an outbox row would be, in
	// the slot's snapshot).
	testkit.WaitFor(t, 60*time.Second, "the first checkpoint", func() bool {
		return count(t, db, `SELECT count(*) FROM relay_checkpoints WHERE slot_name = $1`, db.Slot) == 1
	})

	// The producer: every fifth transaction rolls back; of the committed
	// ones, every other emits with outbox.Emit (an id) and the rest with
	// plain SQL and no id.
	total := committed + rolledBack
	var produced atomic.Int32
	withID := map[string]uuid.UUID{} // brief → event id
	var noID, rolled []string
	var refusedBriefs []string
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			for i := range total {
				brief, tenant := uuid.New(), uuid.New()
				tx, err := db.Pool.Begin(ctx)
				if err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, `INSERT INTO research_briefs (id, tenant_id, title, body) VALUES ($1, $2, $3, 'messages through kills')`,
					brief, tenant, fmt.Sprintf("brief %d", i)); err != nil {
					tx.Rollback(ctx)
					return err
				}
				rollback := i%5 == 4
				if i%2 == 0 || rollback {
					id := uuid.New()
					err = outbox.Emit(ctx, tx, outbox.Message{ID: id, TenantID: tenant, AggregateType: "research_brief",
						AggregateID: brief.String(), EventType: "research_brief.created", Payload: map[string]string{"brief_id": brief.String()}})
					if !rollback {
						withID[brief.String()] = id
					}
				} else {
					_, err = tx.Exec(ctx, `SELECT pg_logical_emit_message(true, 'outbox', json_build_object('tenant_id', $1::uuid, 'aggregate_type', 'research_brief',
						'aggregate_id', $2::text, 'event_type', 'research_brief.created', 'payload', json_build_object('brief_id', $2::text))::text)`, tenant, brief.String())
					noID = append(noID, brief.String())
				}
				if err != nil {
					tx.Rollback(ctx)
					return err
				}
				if i == total/2 {
					// The refused ones, amid the stream. The non-transactional
					// one would start a saga and match the sink, were it taken.
					nonTx := uuid.NewString()
					refusedBriefs = append(refusedBriefs, nonTx)
					for _, q := range []string{
						`SELECT pg_logical_emit_message(false, 'outbox', '{"event_type": "research_brief.created", "payload": {"brief_id": "` + nonTx + `"}}')`,
						`SELECT pg_logical_emit_message(true, 'outbox', 'brief: not JSON')`,
						`SELECT pg_logical_emit_message(true, 'outbox', '{"aggregate_type": "research_brief", "payload": {}}')`,
					} {
						if _, err := tx.Exec(ctx, q); err != nil {
							tx.Rollback(ctx)
							return err
						}
					}
				}
				if rollback {
					rolled = append(rolled, brief.String())
					if err := tx.Rollback(ctx); err != nil {
						return err
					}
				} else if err := tx.Commit(ctx); err != nil {
					return err
				}
				produced.Add(1)
				time.Sleep(pause)
			}
			return nil
		}()
	}()

	sagas := func() int {
		return count(t, db, `SELECT count(*) FROM saga_instances WHERE saga_name = 'brief_enrichment'`)
	}
	before := 0
	for k, at := range []int{total / 3, 2 * total / 3} {
		testkit.WaitFor(t, 60*time.Second, fmt.Sprintf("%d transactions before kill %d", at, k+1), func() bool { return int(produced.Load()) >= at })
		// Each relay streams before it is killed.
		testkit.WaitFor(t, 60*time.Second, fmt.Sprintf("relay %d to start sagas", k+1), func() bool { return sagas() > before })
		before = sagas()
		p.Kill()
		t.Logf("kill %d after %d transactions and %d sagas, %s in", k+1, produced.Load(), before, time.Since(began).Round(time.Millisecond))
		p = relaytest.Start(t, env, args...)
	}
	if err := <-done; err != nil {
		t.Fatalf("producer: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			var dl string
			db.Pool.QueryRow(ctx, `SELECT coalesce(string_agg(reason || ' ' || raw::text, E'\n'), '') FROM relay_dead_letters`).Scan(&dl)
			t.Logf("instances %d, dead letters:\n%s\nrelay:\n%s", count(t, db, `SELECT count(*) FROM saga_instances`), dl, p.Output())
		}
	})
	testkit.WaitFor(t, 120*time.Second, "every committed event to start its saga", func() bool {
		return count(t, db, `SELECT count(DISTINCT trigger_event_id) FROM saga_instances WHERE saga_name = 'brief_enrichment'`) >= committed
	})
	testkit.WaitFor(t, 120*time.Second, "every committed event at the webhook", func() bool { return len(hook.snapshot()) >= committed })
	testkit.WaitFor(t, 60*time.Second, "three dead letters", func() bool { return count(t, db, `SELECT count(*) FROM relay_dead_letters`) >= 3 })
	t.Logf("all %d events started and delivered after %s", committed, time.Since(began).Round(time.Millisecond))
	time.Sleep(time.Second) // a duplicate start or delivery would show by now
	p.Stop(30 * time.Second)
	t.Logf("stopped after %s", time.Since(began).Round(time.Millisecond))

	if n := count(t, db, `SELECT count(*) FROM saga_instances WHERE saga_name = 'brief_enrichment'`); n != committed {
		t.Errorf("%d instances for %d committed events", n, committed)
	}
	triggers := map[string]bool{}
	rows, err := db.Pool.Query(ctx, `SELECT trigger_event_id::text FROM saga_instances WHERE saga_name = 'brief_enrichment'`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		triggers[id] = true
	}
	got := hook.snapshot()
	deliveredUnder := map[string]bool{}
	for brief, byID := range got {
		if len(byID) != 1 {
			t.Errorf("brief %s was delivered under %d ids: %v", brief, len(byID), byID)
		}
		for id := range byID {
			deliveredUnder[id] = true
			if !triggers[id] {
				t.Errorf("brief %s was delivered under %s, which started no saga", brief, id)
			}
		}
	}
	for brief, id := range withID {
		if _, ok := got[brief][id.String()]; !ok {
			t.Errorf("brief %s was not delivered under its message's id %s: %v", brief, id, got[brief])
		}
	}
	for _, brief := range noID {
		if len(got[brief]) != 1 {
			t.Errorf("brief %s (a message without an id) was delivered under %v", brief, got[brief])
		}
	}
	for _, brief := range append(rolled, refusedBriefs...) {
		if len(got[brief]) > 0 {
			t.Errorf("brief %s, rolled back or refused, was delivered", brief)
		}
	}
	if len(triggers) != committed || len(deliveredUnder) != committed {
		t.Errorf("%d triggers and %d delivered ids for %d committed events", len(triggers), len(deliveredUnder), committed)
	}
	rows, err = db.Pool.Query(ctx, `SELECT reason FROM relay_dead_letters ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	reasons, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(reasons) != 3 {
		t.Errorf("%d dead letters, want 3: %q", len(reasons), reasons)
	}
	joined := strings.Join(reasons, "\n")
	for _, want := range []string{"non-transactional", "not JSON", "no event_type"} {
		if !strings.Contains(joined, want) {
			t.Errorf("no dead letter says %q:\n%s", want, joined)
		}
	}
}
