package relay_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/relay"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/test/pgtest"
)

// TestTriggerFilterAndSchema runs a declared saga whose trigger has a
// filter and a schema on a real PostgreSQL through the relay: an event that
// fits and passes starts it, one the filter refuses starts nothing and is
// counted as filtered, one that does not match the schema is a dead letter
// with the schema's error and starts nothing; events after them go on.
func TestTriggerFilterAndSchema(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := t.Context()
	dir := t.TempDir()
	def := `saga: big_orders
version: 1
triggers:
  - event_type: order.placed
    filter: "${ trigger.payload.cents >= 100 }"
    schema:
      type: object
      required: [order_id, cents]
      properties:
        order_id: {type: string}
        cents: {type: integer}
steps:
  - name: note
    sql:
      query: INSERT INTO contract_notes (order_id) VALUES ($1)
      params: ["${ trigger.payload.order_id }"]
`
	if err := os.WriteFile(filepath.Join(dir, "big_orders.yaml"), []byte(def), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE contract_notes (order_id text)`); err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(ctx, relay.Config{
		DatabaseURL: db.URL, Registry: saga.NewRegistry(), Slot: db.Slot, Publication: db.Publication,
		Workers: 2, StatusInterval: 200 * time.Millisecond, Sagas: dir, HTTPAddr: "127.0.0.1:0",
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Stop(context.Background()) })

	write := func(payload string) {
		t.Helper()
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			return outbox.Write(ctx, tx, outbox.Message{AggregateType: "order", EventType: "order.placed", Payload: []byte(payload)})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	write(`{"order_id": "small", "cents": 5}`)        // filtered
	write(`{"order_id": "bad", "cents": "a lot"}`)    // does not match the schema
	write(`{"order_id": "big", "cents": 500}`)        // starts
	write(`{"order_id": "missing-cents"}`)            // does not match the schema
	write(`{"order_id": "big-after", "cents": 1000}`) // starts

	deadline := time.Now().Add(30 * time.Second)
	for {
		var notes, dead int
		if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM contract_notes), (SELECT count(*) FROM relay_dead_letters)`).Scan(&notes, &dead); err != nil {
			t.Fatal(err)
		}
		if notes == 2 && dead == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30s: %d notes (want 2), %d dead letters (want 2)", notes, dead)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var started []string
	rows, err := db.Pool.Query(ctx, `SELECT order_id FROM contract_notes ORDER BY order_id`)
	if err != nil {
		t.Fatal(err)
	}
	started, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || strings.Join(started, ",") != "big,big-after" {
		t.Fatalf("started for %v (%v), want big and big-after", started, err)
	}
	var instances int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM saga_instances`).Scan(&instances); err != nil || instances != 2 {
		t.Errorf("%d instances (%v), want 2: a filtered or misfit event started one", instances, err)
	}
	rows, err = db.Pool.Query(ctx, `SELECT reason FROM relay_dead_letters ORDER BY reason`)
	if err != nil {
		t.Fatal(err)
	}
	reasons, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"at /: missing property 'cents'", "at /cents: got string, want integer"} {
		if i >= len(reasons) || !strings.Contains(reasons[i], "payload does not match the trigger's schema") || !strings.Contains(reasons[i], want) {
			t.Errorf("dead letter reasons %q lack %q", reasons, want)
		}
	}

	resp, err := http.Get("http://" + r.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `compensa_events_total{outcome="filtered"} 1`) {
		var lines []string
		for _, l := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(l, "compensa_events_total") {
				lines = append(lines, l)
			}
		}
		t.Errorf("metrics lack one filtered event:\n%s", strings.Join(lines, "\n"))
	}
}
