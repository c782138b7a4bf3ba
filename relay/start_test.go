package relay_test

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/compensa/compensa/relay"
	"github.com/compensa/compensa/test/pgtest"
)

// TestStartByHandStartsOnce: POST /v1/sagas writes the trigger event to the
// outbox; the stream and the correlator start the saga from it like any
// other; the same idempotency key, sent again before and after the start,
// never starts a second instance, and a new key starts a new one.
func TestStartByHandStartsOnce(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := t.Context()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE relay_test_steps (order_id text, step text)`); err != nil {
		t.Fatal(err)
	}
	raw := make([]byte, 24)
	rand.Read(raw)
	token := hex.EncodeToString(raw)
	r, err := relay.New(ctx, relay.Config{
		DatabaseURL: db.URL, Registry: orderRegistry(t), Slot: db.Slot, Publication: db.Publication,
		Workers: 2, StatusInterval: 200 * time.Millisecond, HTTPAddr: "127.0.0.1:0", APIToken: token,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Stop(t.Context()) })

	type result struct {
		EventID    string  `json:"event_id"`
		EventType  string  `json:"event_type"`
		Created    bool    `json:"created"`
		InstanceID *string `json:"instance_id"`
	}
	post := func(body string) (int, result) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+r.Addr()+"/v1/sagas", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var res result
		if resp.StatusCode < 300 {
			if err := json.Unmarshal(b, &res); err != nil {
				t.Fatalf("%s: %v", b, err)
			}
		}
		return resp.StatusCode, res
	}
	instances := func(order string) int {
		t.Helper()
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM saga_instances WHERE saga_name = 'order' AND context->>'order_id' = $1`, order).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	body := `{"saga": "order", "payload": {"order_id": "o-7"}, "aggregate_id": "o-7", "idempotency_key": "checkout-7"}`
	code, first := post(body)
	if code != http.StatusAccepted || !first.Created || first.EventType != "order.placed" {
		t.Fatalf("first start: %d %+v, want 202 with a written order.placed", code, first)
	}
	code, again := post(body)
	if code != http.StatusOK || again.Created || again.EventID != first.EventID {
		t.Fatalf("second start with the same key: %d %+v, want 200 naming event %s", code, again, first.EventID)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM relay_test_steps WHERE order_id = 'o-7'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30s, %d of 2 steps ran for the saga started by hand", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The outbox row is gone (retention, say): the key still names the
	// instance it started, and nothing starts again.
	if _, err := db.Pool.Exec(ctx, `DELETE FROM outbox WHERE id = $1`, first.EventID); err != nil {
		t.Fatal(err)
	}
	code, late := post(body)
	if code != http.StatusOK || late.InstanceID == nil {
		t.Fatalf("start with the same key after the instance ran: %d %+v, want 200 naming the instance", code, late)
	}
	if n := instances("o-7"); n != 1 {
		t.Fatalf("%d instances for one idempotency key, want 1", n)
	}
	if code, _ := post(`{"saga": "order", "payload": {"order_id": "o-8"}, "idempotency_key": "checkout-8"}`); code != http.StatusAccepted {
		t.Fatalf("a new key: %d, want 202", code)
	}
	if code, _ := post(`{"saga": "nope", "payload": {}}`); code != http.StatusNotFound {
		t.Errorf("an unknown saga: %d, want 404", code)
	}
	if code, _ := post(`{"saga": "order", "payload": [1]}`); code != http.StatusBadRequest {
		t.Errorf("a payload that is not an object: %d, want 400", code)
	}
	for time.Now().Before(deadline) && instances("o-8") != 1 {
		time.Sleep(50 * time.Millisecond)
	}
	if n := instances("o-8"); n != 1 {
		t.Fatalf("%d instances for the second key, want 1", n)
	}
}
