package sinks

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/relay"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/sink/webhook"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

// TestPostEventsRoundTrip: a saga step sends a command; a webhook sink
// delivers it to a participant that has no database access; the
// participant answers through POST /v1/events; the waiting step completes.
func TestPostEventsRoundTrip(t *testing.T) {
	// Not parallel: the webhook secret is passed through the environment.
	ctx := context.Background()
	db := pgtest.NewDB(t)
	token := "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd6"
	t.Setenv("RT_WEBHOOK_SECRET", secret)

	var relayAddr atomic.Value
	var commands, replies, bad atomic.Int32
	key, _ := webhook.DecodeSecret(secret)
	participant := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !webhook.Verify(key, r.Header.Get("webhook-id"), r.Header.Get("webhook-timestamp"), body, r.Header.Get("webhook-signature")) {
			bad.Add(1)
			w.WriteHeader(401)
			return
		}
		var cmd sink.Event
		json.Unmarshal(body, &cmd)
		commands.Add(1)
		w.WriteHeader(202)
		go func() {
			// The reply: the command's id as correlation id, posted twice
			// with one id (the second is a no-op).
			replyID := uuid.NewSHA1(uuid.NameSpaceOID, []byte(cmd.ID))
			reply, _ := json.Marshal(map[string]any{"id": replyID, "event_type": "payment.charged", "correlation_id": cmd.ID,
				"causation_id": cmd.ID, "aggregate_type": "order", "aggregate_id": cmd.AggregateID, "payload": map[string]any{"ok": true, "charge": "ch_1"}})
			for i, want := range []int{201, 200} {
				req, _ := http.NewRequest("POST", "http://"+relayAddr.Load().(string)+"/v1/events", bytes.NewReader(reply))
				req.Header.Set("Authorization", "Bearer "+token)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Errorf("post reply: %v", err)
					return
				}
				msg, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != want {
					t.Errorf("post %d of the reply: %s %s, want %d", i+1, resp.Status, msg, want)
				}
			}
			replies.Add(1)
		}()
	}))
	defer participant.Close()

	file := filepath.Join(t.TempDir(), "sinks.yaml")
	os.WriteFile(file, []byte(fmt.Sprintf(`sinks:
  - name: payments
    match: { event_types: ["payment.charge"] }
    webhook:
      url: %s/commands
      secret_env: RT_WEBHOOK_SECRET
      timeout: 5s
`, participant.URL)), 0o600)

	reg := saga.NewRegistry()
	reg.MustRegister(saga.Definition{Name: "checkout", Version: 1, Triggers: []saga.Trigger{{EventType: "order.placed"}},
		Steps: []saga.Step{{Name: "charge", ReplyTimeout: 30 * time.Second, Do: func(ctx context.Context, x *saga.StepTx) error {
			return x.EmitCommand(ctx, outbox.Message{EventType: "payment.charge", AggregateType: "order", AggregateID: "o-1", Payload: map[string]int{"cents": 1200}})
		}}}})
	r, err := relay.New(ctx, relay.Config{DatabaseURL: db.URL, Registry: reg, Slot: db.Slot, Publication: db.Publication,
		HTTPAddr: "127.0.0.1:0", APIToken: token, Sinks: file, Workers: 2,
		StatusInterval: 100 * time.Millisecond, HeartbeatInterval: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := r.Stop(sctx); err != nil {
			t.Error(err)
		}
	}()
	relayAddr.Store(r.Addr())

	// Without a token the API refuses to write.
	resp, err := http.Post("http://"+r.Addr()+"/v1/events", "application/json", bytes.NewReader([]byte(`{"event_type":"x"}`)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusForbidden {
		t.Fatalf("POST /v1/events without a token: %s", resp.Status)
	}

	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.Write(ctx, tx, outbox.Message{EventType: "order.placed", AggregateType: "order", AggregateID: "o-1", Payload: map[string]int{"total": 1200}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 60*time.Second, "the saga to complete through the webhook and the API", func() bool {
		return count(t, db, `SELECT count(*) FROM saga_instances WHERE saga_name = 'checkout' AND status = 'COMPLETED'`) == 1
	})
	if commands.Load() < 1 || replies.Load() != 1 || bad.Load() != 0 {
		t.Fatalf("commands %d, replies %d, bad signatures %d", commands.Load(), replies.Load(), bad.Load())
	}
	if n := count(t, db, `SELECT count(*) FROM outbox WHERE event_type = 'payment.charged'`); n != 1 {
		t.Fatalf("%d reply rows in the outbox, want 1 (the second post is idempotent)", n)
	}
	st, err := sink.List(ctx, db.Pool)
	if err != nil || len(st) != 1 || st[0].Name != "payments" || st[0].Delivered < 1 {
		t.Fatalf("sinks: %+v %v", st, err)
	}

	// The same through the API, and the metrics.
	call := func(method, path string) (int, string) {
		req, _ := http.NewRequest(method, "http://"+r.Addr()+path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	var list struct{ Sinks []sink.Status }
	code, body := call("GET", "/v1/sinks")
	if json.Unmarshal([]byte(body), &list); code != 200 || len(list.Sinks) != 1 || list.Sinks[0].Name != "payments" || list.Sinks[0].State != sink.StateUp {
		t.Fatalf("GET /v1/sinks: %d %s", code, body)
	}
	if code, body := call("POST", "/v1/sinks/nope/retry"); code != 404 {
		t.Fatalf("retry of an unknown sink: %d %s", code, body)
	}
	if code, body := call("POST", "/v1/sinks/payments/retry"); code != 200 {
		t.Fatalf("retry: %d %s", code, body)
	}
	_, metrics := call("GET", "/metrics")
	for _, want := range []string{`compensa_sink_delivered_total{sink="payments"}`, `compensa_sink_parked{sink="payments"} 0`, `compensa_sink_delivery_seconds_count{sink="payments"}`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestBadSinksFileFailsBeforeConnecting: relay.New reports every problem of
// the sinks file, as a sink.ErrConfig, before it tries the database.
func TestBadSinksFileFailsBeforeConnecting(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "sinks.yaml")
	os.WriteFile(file, []byte("sinks:\n  - name: a\n    nats: {url: 'nats://h:1'}\n  - name: a\n    webhook: {url: 'ftp://x'}\n"), 0o600)
	_, err := relay.New(context.Background(), relay.Config{DatabaseURL: "postgres://nobody@127.0.0.1:1/none", Registry: saga.NewRegistry(), Sinks: file})
	if !errors.Is(err, sink.ErrConfig) || strings.Count(err.Error(), file+":") != 3 {
		t.Fatalf("err = %v, want the file's three problems", err)
	}
}
