package e2e

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

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

// plantedSecret must never leave the HTTP request it authorises.
const plantedSecret = "s3cr3t-planted-7f1c0a"

const ordersSchema = `
CREATE TABLE orders (id uuid PRIMARY KEY, status text NOT NULL DEFAULT 'PLACED', blocked boolean NOT NULL DEFAULT false);
CREATE TABLE stock (sku text PRIMARY KEY, on_hand integer NOT NULL, reserved integer NOT NULL DEFAULT 0);
INSERT INTO stock (sku, on_hand) VALUES ('apple', 1000), ('pear', 1000);`

// orderSaga is the orders example without the shipping step.
const orderSaga = `# yaml-language-server: $schema=saga.schema.json
saga: order_fulfilment
version: 1
triggers:
  - event_type: order.placed
deadline: 2m
defaults:
  timeout: 5s
  retry: { max_attempts: 5, initial: 50ms, factor: 2, max: 1s }
  compensation_retry: { max_attempts: 20, initial: 50ms, factor: 2, max: 1s }
steps:
  - name: reserve_stock
    sql:
      query: >
        UPDATE stock SET reserved = reserved + $1
        WHERE sku = $2 AND on_hand - reserved >= $1 RETURNING sku
      params: ["${ trigger.payload.qty }", "${ trigger.payload.sku }"]
      expect: one_row
    output: { sku: "${ result.rows[0].sku }" }
    compensate:
      sql:
        query: UPDATE stock SET reserved = reserved - $1 WHERE sku = $2
        params: ["${ trigger.payload.qty }", "${ steps.reserve_stock.sku }"]
  - name: charge_payment
    http:
      method: POST
      url: "PAYSVC/charges"
      headers: { Authorization: "${ 'Bearer ' + secrets.PAYMENTS_TOKEN }" }
      body: { order_id: "${ trigger.payload.order_id }", cents: "${ trigger.payload.cents }" }
    output: { charge_id: "${ response.body.id }" }
    compensate:
      http: { method: POST, url: "PAYSVC/refunds", body: { charge_key: "${ step.idempotency_key }" } }
  - name: confirm
    sql:
      query: UPDATE orders SET status = 'CONFIRMED' WHERE id = $1::uuid AND NOT blocked
      params: ["${ trigger.payload.order_id }"]
      expect: one_row
    emit:
      - event_type: order.confirmed
        aggregate_type: order
        aggregate_id: "${ trigger.aggregate_id }"
        payload: { order_id: "${ trigger.payload.order_id }" }
`

// payments is a payment service: it deduplicates charges by
// Idempotency-Key, declines orders over 10000 cents (402, with the
// Authorization it got in the body, as a careless service might), and
// records every request.
type payments struct {
	mu       sync.Mutex
	charges  map[string]string // idempotency key -> charge id
	byOrder  map[string]int    // order id -> charges made
	refunds  map[string]int    // charge id -> refunds
	keys     map[string]map[string]bool
	failNext int           // answer 503 to this many charge requests first
	delay    time.Duration // before answering a charge
	// unavailable marks the declined orders that got their 503.
	unavailable map[string]bool
	bad         []string
}

func newServer(p *payments) *httptest.Server { return httptest.NewServer(p) }

func newPayments() *payments {
	return &payments{charges: map[string]string{}, byOrder: map[string]int{}, refunds: map[string]int{}, keys: map[string]map[string]bool{}, unavailable: map[string]bool{}}
}

func (p *payments) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		p.bad = append(p.bad, "no Idempotency-Key on "+r.URL.Path)
	}
	switch {
	case r.URL.Path == "/charges":
		if p.delay > 0 {
			p.mu.Unlock()
			time.Sleep(p.delay)
			p.mu.Lock()
		}
		if r.Header.Get("Authorization") != "Bearer "+plantedSecret {
			p.bad = append(p.bad, "bad Authorization")
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var body struct {
			OrderID string `json:"order_id"`
			Cents   int64  `json:"cents"`
		}
		b, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(b, &body); err != nil {
			p.bad = append(p.bad, "charge body: "+err.Error()+": "+string(b))
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		if p.keys[body.OrderID] == nil {
			p.keys[body.OrderID] = map[string]bool{}
		}
		p.keys[body.OrderID][key] = true
		if p.failNext > 0 {
			p.failNext--
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		if body.Cents > 10000 && !p.unavailable[body.OrderID] {
			// A declined order first meets a 503: the step may have acted,
			// so the saga compensates it, without a charge id to refund.
			p.unavailable[body.OrderID] = true
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		if body.Cents > 10000 {
			w.WriteHeader(http.StatusPaymentRequired)
			fmt.Fprintf(w, `{"error":"declined","auth":%q}`, r.Header.Get("Authorization"))
			return
		}
		id, seen := p.charges[key]
		if !seen {
			id = uuid.NewString()
			p.charges[key] = id
			p.byOrder[body.OrderID]++
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":%q}`, id)
	case r.URL.Path == "/refunds":
		// A refund names the charge by its request's Idempotency-Key: a
		// key that charged nothing (a 503, a decline) refunds nothing.
		var body struct {
			ChargeKey string `json:"charge_key"`
		}
		b, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(b, &body); err != nil || !strings.HasSuffix(body.ChargeKey, ":charge_payment") {
			p.bad = append(p.bad, "refund body "+string(b))
		}
		if !strings.HasSuffix(key, ":charge_payment:compensate") {
			p.bad = append(p.bad, "refund key "+key)
		}
		if id, charged := p.charges[body.ChargeKey]; charged {
			p.refunds[id]++
		}
		fmt.Fprint(w, `{"ok":true}`)
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

type order struct {
	id      uuid.UUID
	event   uuid.UUID
	sku     string
	qty     int
	cents   int
	blocked bool
}

func placeOrder(t *testing.T, db *pgtest.DB, o order) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO orders (id, blocked) VALUES ($1, $2)`, o.id, o.blocked); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Write(ctx, tx, outbox.Message{ID: o.event, AggregateType: "order", AggregateID: o.id.String(),
		EventType: "order.placed", Payload: map[string]any{"order_id": o.id.String(), "sku": o.sku, "qty": o.qty, "cents": o.cents}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

func writeSaga(t *testing.T, dir, name, body, paymentsURL string) {
	t.Helper()
	body = strings.ReplaceAll(body, "PAYSVC", paymentsURL)
	if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

func statusOf(t *testing.T, db *pgtest.DB, event uuid.UUID) string {
	var st string
	err := db.Pool.QueryRow(context.Background(), `SELECT status::text FROM saga_instances WHERE trigger_event_id = $1`, event).Scan(&st)
	if err != nil {
		return ""
	}
	return st
}

// TestDeclaredOrderSaga runs the example saga through the real relay: an
// accepted order completes, a declined charge compensates the stock
// reservation only, an order whose confirmation fails is refunded and
// released in reverse order, and the planted secret appears nowhere but in
// the requests it authorises.
func TestDeclaredOrderSaga(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	if _, err := db.Pool.Exec(context.Background(), ordersSchema); err != nil {
		t.Fatal(err)
	}
	pay := newPayments()
	pay.failNext = 2 // the first charges meet a 503 and are retried
	srv := httptest.NewServer(pay)
	defer srv.Close()
	dir := t.TempDir()
	writeSaga(t, dir, "order_fulfilment.yaml", orderSaga, srv.URL)

	p := relaytest.Start(t, []string{"RELAY_SECRET_PAYMENTS_TOKEN=" + plantedSecret},
		relayArgs(db, "--sagas", dir, "--log-level", "debug", "--api-token", "tok-for-test-0123456789abcdef")...)

	var orders []order
	for i := range 12 {
		o := order{id: uuid.New(), event: uuid.New(), sku: "apple", qty: 1 + i%3, cents: 500}
		switch i % 4 {
		case 1:
			o.cents = 20000 // declined
		case 2:
			o.blocked = true // confirmation fails after the charge
		}
		if i%2 == 1 {
			o.sku = "pear"
		}
		orders = append(orders, o)
		placeOrder(t, db, o)
	}
	testkit.WaitFor(t, 60*time.Second, "every order's saga to end", func() bool {
		for _, o := range orders {
			if st := statusOf(t, db, o.event); st != "COMPLETED" && st != "COMPENSATED" {
				return false
			}
		}
		return true
	})

	reserved := map[string]int{}
	for _, o := range orders {
		st := statusOf(t, db, o.event)
		var ostatus string
		if err := db.Pool.QueryRow(context.Background(), `SELECT status FROM orders WHERE id = $1`, o.id).Scan(&ostatus); err != nil {
			t.Fatal(err)
		}
		declined, blocked := o.cents > 10000, o.blocked
		pay.mu.Lock()
		charged, keys := pay.byOrder[o.id.String()], len(pay.keys[o.id.String()])
		refunds := pay.refunds[chargeOf(pay, o)]
		pay.mu.Unlock()
		if keys != 1 {
			t.Errorf("order %s: %d different Idempotency-Keys for its charge; want 1", o.id, keys)
		}
		switch {
		case declined:
			if st != "COMPENSATED" || charged != 0 || refunds != 0 {
				t.Errorf("declined order: status %s, charged %d, refunds %d; want COMPENSATED, 0, 0", st, charged, refunds)
			}
		case blocked:
			if st != "COMPENSATED" || charged != 1 || refunds != 1 {
				t.Errorf("blocked order: status %s, charged %d, refunds %d; want COMPENSATED, 1, 1", st, charged, refunds)
			}
			// Reverse order: the refund (step 1) before the release (step 0).
			var steps []int
			rows, err := db.Pool.Query(context.Background(), `SELECT e.step FROM saga_events e JOIN saga_instances i ON i.id = e.instance_id
				WHERE i.trigger_event_id = $1 AND e.kind = 'step_compensated' ORDER BY e.version`, o.event)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var s int
				_ = rows.Scan(&s)
				steps = append(steps, s)
			}
			rows.Close()
			if fmt.Sprint(steps) != "[1 0]" {
				t.Errorf("blocked order compensated steps %v; want [1 0]", steps)
			}
		default:
			if st != "COMPLETED" || charged != 1 || refunds != 0 || ostatus != "CONFIRMED" {
				t.Errorf("accepted order: status %s, charged %d, refunds %d, order %s", st, charged, refunds, ostatus)
			}
			reserved[o.sku] += o.qty
		}
	}
	for _, sku := range []string{"apple", "pear"} {
		if got := count(t, db, `SELECT reserved FROM stock WHERE sku = $1`, sku); got != reserved[sku] {
			t.Errorf("stock %s reserved %d; want %d (the accepted orders' quantities)", sku, got, reserved[sku])
		}
	}
	if n := count(t, db, `SELECT count(*) FROM outbox WHERE event_type = 'order.confirmed'`); n != 6 {
		t.Errorf("%d order.confirmed rows; want 6", n)
	}
	if n := count(t, db, `SELECT count(*) FROM saga_definitions WHERE saga_name = 'order_fulfilment' AND saga_version = 1`); n != 1 {
		t.Errorf("the definition is stored %d times", n)
	}
	pay.mu.Lock()
	if len(pay.bad) > 0 {
		t.Errorf("the payment service saw bad requests: %v", pay.bad)
	}
	pay.mu.Unlock()

	// The secret: nowhere in the journal, the steps, the instances, the API
	// or the logs (debug level), though a 402 body carried it back.
	for _, q := range []string{
		`SELECT count(*) FROM saga_events WHERE payload::text LIKE '%' || $1 || '%'`,
		`SELECT count(*) FROM saga_steps WHERE coalesce(output::text, '') || coalesce(last_error, '') LIKE '%' || $1 || '%'`,
		`SELECT count(*) FROM saga_instances WHERE context::text || coalesce(last_error, '') || coalesce(compensation_reason, '') LIKE '%' || $1 || '%'`,
		`SELECT count(*) FROM outbox WHERE payload::text || headers::text LIKE '%' || $1 || '%'`,
		`SELECT count(*) FROM saga_definitions WHERE body LIKE '%' || $1 || '%'`,
	} {
		if n := count(t, db, q, plantedSecret); n != 0 {
			t.Errorf("the secret is in %d rows: %s", n, q)
		}
	}
	if n := count(t, db, `SELECT count(*) FROM saga_events WHERE payload::text LIKE '%<secret PAYMENTS_TOKEN>%'`); n == 0 {
		t.Errorf("the declined charges' errors were not redacted where the secret was (no <secret PAYMENTS_TOKEN> in the journal)")
	}
	for _, path := range []string{"/v1/sagas?limit=100", "/v1/sagas?status=COMPENSATED&limit=100"} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+p.Addr+path, nil)
		req.Header.Set("Authorization", "Bearer tok-for-test-0123456789abcdef")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), plantedSecret) {
			t.Errorf("the API answer to %s holds the secret", path)
		}
		var page struct {
			Items []struct {
				ID string `json:"id"`
			} `json:"items"`
		}
		_ = json.Unmarshal(b, &page)
		for _, it := range page.Items {
			req, _ := http.NewRequest(http.MethodGet, "http://"+p.Addr+"/v1/sagas/"+it.ID, nil)
			req.Header.Set("Authorization", "Bearer tok-for-test-0123456789abcdef")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(b), plantedSecret) {
				t.Errorf("the API answer for instance %s holds the secret", it.ID)
			}
		}
	}
	// GET /v1/definitions lists the declared saga with its file, hash and
	// step kinds.
	req, _ := http.NewRequest(http.MethodGet, "http://"+p.Addr+"/v1/definitions", nil)
	req.Header.Set("Authorization", "Bearer tok-for-test-0123456789abcdef")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var defs struct {
		Items []struct {
			Name    string `json:"name"`
			Version int    `json:"version"`
			Source  string `json:"source"`
			Hash    string `json:"hash"`
			Steps   []struct {
				Name, Kind, Compensate string
			} `json:"steps"`
		} `json:"items"`
	}
	err = json.NewDecoder(resp.Body).Decode(&defs)
	resp.Body.Close()
	// The Go saga of this binary (the briefs example, registered where its
	// schema exists) and the file saga share one registry.
	if err != nil || len(defs.Items) != 2 || defs.Items[0].Name != "brief_enrichment" || defs.Items[0].Source != "go" {
		t.Fatalf("/v1/definitions: %v %+v", err, defs)
	}
	d := defs.Items[1]
	var kinds []string
	for _, st := range d.Steps {
		kinds = append(kinds, st.Name+":"+st.Kind+"/"+st.Compensate)
	}
	if d.Name != "order_fulfilment" || d.Version != 1 || !strings.HasSuffix(d.Source, "order_fulfilment.yaml") || len(d.Hash) != 64 ||
		strings.Join(kinds, " ") != "reserve_stock:sql/sql charge_payment:http/http confirm:sql/" {
		t.Fatalf("/v1/definitions: %+v", d)
	}
	p.Stop(30 * time.Second)
	if strings.Contains(p.Output(), plantedSecret) {
		t.Errorf("the relay's log holds the secret")
	}
}

// chargeOf is the charge id made for an order (caller holds p.mu).
func chargeOf(p *payments, o order) string {
	for k := range p.keys[o.id.String()] {
		if id, ok := p.charges[k]; ok {
			return id
		}
	}
	return ""
}
