package sinks

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/sink/webhook"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

// TestFilterAndTransformThroughTheRelay: a webhook sink whose filter keeps
// the events with an even n and whose transform reshapes the payload,
// through the real relay: exactly the kept half arrives, transformed, in
// order per aggregate; nothing filtered is parked, and
// compensa_sink_filtered_total and relay_sinks.filtered (relay sinks list,
// /v1/sinks) count the other half. A second sink's
// transform fails on an event without the key it reads: that event is
// parked for that sink with the expression's reason.
func TestFilterAndTransformThroughTheRelay(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	key, _ := webhook.DecodeSecret(secret)
	var mu sync.Mutex
	got := map[string][]map[string]any{} // by path
	var bad []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var env map[string]any
		mu.Lock()
		defer mu.Unlock()
		if !webhook.Verify(key, r.Header.Get("webhook-id"), r.Header.Get("webhook-timestamp"), body, r.Header.Get("webhook-signature")) {
			bad = append(bad, "signature")
		} else if err := json.Unmarshal(body, &env); err != nil {
			bad = append(bad, err.Error())
		} else {
			got[r.URL.Path] = append(got[r.URL.Path], env)
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	file := filepath.Join(t.TempDir(), "sinks.yaml")
	os.WriteFile(file, []byte(fmt.Sprintf(`sinks:
  - name: shaped
    match: { event_types: ["order.placed"] }
    filter: "${ event.payload.n %% 2 == 0 }"
    transform:
      order: "${ event.aggregate_id }"
      double: "${ event.payload.n * 2 }"
      label: "n=${ event.payload.n }"
      fixed: [1, "two"]
    webhook: { url: "%s/shaped", secret_env: SHAPE_SECRET, timeout: 5s }
  - name: strict
    match: { event_types: ["order.noted"] }
    transform: { must: "${ event.payload.must }" }
    webhook: { url: "%s/strict", secret_env: SHAPE_SECRET, timeout: 5s }
`, srv.URL, srv.URL)), 0o600)
	p := relaytest.Start(t, []string{"SHAPE_SECRET=" + secret}, "--database-url", db.URL, "--slot", db.Slot,
		"--publication", db.Publication, "--status-interval", "200ms", "--workers", "1", "--sinks", file)

	n := 20
	if testing.Short() {
		n = 10
	}
	ctx := context.Background()
	noted := uuid.New()
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		var msgs []outbox.Message
		for i := range n {
			msgs = append(msgs, outbox.Message{AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", i%3), EventType: "order.placed", Payload: map[string]int{"n": i}})
		}
		msgs = append(msgs, outbox.Message{ID: noted, AggregateType: "order", AggregateID: "o-9", EventType: "order.noted", Payload: map[string]int{"other": 1}})
		return outbox.Write(ctx, tx, msgs...)
	})
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 60*time.Second, "the event the transform fails on to be parked", func() bool {
		return count(t, db, `SELECT count(*) FROM relay_sink_parked WHERE sink = 'strict'`) == 1
	})
	testkit.WaitFor(t, 60*time.Second, "the kept half", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got["/shaped"]) >= n/2
	})
	time.Sleep(500 * time.Millisecond) // anything filtered that would arrive has had the time
	mu.Lock()
	shaped, strict := got["/shaped"], got["/strict"]
	mu.Unlock()
	if len(bad) > 0 {
		t.Errorf("bad requests: %v", bad)
	}
	if len(shaped) != n/2 || len(strict) != 0 {
		t.Fatalf("shaped got %d events, want %d (the even n); strict got %d, want 0", len(shaped), n/2, len(strict))
	}
	last := map[string]float64{}
	for _, env := range shaped {
		payload, _ := env["payload"].(map[string]any)
		d, _ := payload["double"].(float64)
		order, _ := payload["order"].(string)
		if int(d)%4 != 0 || payload["label"] != fmt.Sprintf("n=%d", int(d)/2) || order != env["aggregate_id"] ||
			fmt.Sprint(payload["fixed"]) != "[1 two]" || len(payload) != 4 {
			t.Errorf("delivered payload %v of %v: want the transform of an even n", payload, env)
		}
		if d <= last[order] && last[order] != 0 {
			t.Errorf("aggregate %s out of order: %v after %v", order, d, last[order])
		}
		last[order] = d
	}
	if c := count(t, db, `SELECT count(*) FROM relay_sink_parked WHERE sink = 'shaped'`); c != 0 {
		t.Errorf("%d events parked for the filtered sink, want none", c)
	}
	var reason string
	if err := db.Pool.QueryRow(ctx, `SELECT reason FROM relay_sink_parked WHERE sink = 'strict' AND event_id = $1`, noted.String()).Scan(&reason); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(reason, "transform: expression ${ event.payload.must } failed") || !strings.Contains(reason, "must") {
		t.Errorf("parked with %q, want the transform's failure", reason)
	}
	testkit.WaitFor(t, 30*time.Second, "relay_sinks to count the filtered half", func() bool {
		st, err := sink.List(ctx, db.Pool)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range st {
			if s.Name == "shaped" {
				return s.Filtered == int64(n-n/2) && s.Parked == 0
			}
		}
		return false
	})
	resp, err := http.Get("http://" + p.Addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := fmt.Sprintf(`compensa_sink_filtered_total{sink="shaped"} %d`, n-n/2); !strings.Contains(string(metrics), want) {
		t.Errorf("metrics lack %q", want)
	}
	p.Stop(30 * time.Second)
}
