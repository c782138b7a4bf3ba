package e2e

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

// TestOrdersExampleRefundsATimedOutCharge runs the orders example's saga
// against its Python payment service, which charges an order and then
// answers too late, on every attempt: the charge step times out after
// acting, gives up, and its compensation refunds the charge by the key the
// charge carried, though the step never recorded a charge id. A saga whose
// compensation still names the charge by that id fails visibly (FAILED,
// with the reason) instead of skipping the refund.
func TestOrdersExampleRefundsATimedOutCharge(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Fatal("python3 is needed for the example's payment service: install it (apt-get install -y python3)")
	}
	t.Parallel()
	root := filepath.Join("..", "..")
	db := pgtest.NewDB(t)
	ctx := context.Background()
	schema, err := os.ReadFile(filepath.Join(root, "examples", "orders", "schema.sql"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, string(schema)); err != nil {
		t.Fatal(err)
	}

	// The example's payment service, on a port of its own.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	token := strings.ReplaceAll(uuid.NewString(), "-", "")
	pay := exec.Command("python3", filepath.Join(root, "examples", "orders", "payments.py"), strings.TrimPrefix(l.Addr().String(), "127.0.0.1:"))
	pay.Env = append(os.Environ(), "PAYMENTS_TOKEN="+token, "PAYMENTS_SLOW_CENTS=6666", "PAYMENTS_SLOW_SECONDS=3")
	pay.Stderr = os.Stderr
	if err := pay.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pay.Process.Kill(); pay.Wait() })
	base := "http://" + l.Addr().String()
	stats := func() map[string]any {
		t.Helper()
		resp, err := http.Get(base + "/stats")
		if err != nil {
			return nil
		}
		defer resp.Body.Close()
		var s map[string]any
		json.NewDecoder(resp.Body).Decode(&s)
		return s
	}
	testkit.WaitFor(t, 20*time.Second, "the payment service", func() bool { return stats() != nil })

	// The example's saga as shipped, on the service's port, with short
	// timeouts and retries; and the same saga with the refund written by
	// the charge's id, as the example once was.
	body, err := os.ReadFile(filepath.Join(root, "examples", "orders", "sagas", "order_fulfilment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	example := strings.ReplaceAll(string(body), "127.0.0.1:8099", "127.0.0.1:"+strconv.Itoa(port))
	for old, repl := range map[string]string{
		"timeout: 10s": "timeout: 1s",
		"retry: { max_attempts: 5, initial: 200ms, factor: 2, max: 10s }":            "retry: { max_attempts: 2, initial: 50ms, factor: 2, max: 100ms }",
		"compensation_retry: { max_attempts: 20, initial: 1s, factor: 2, max: 10m }": "compensation_retry: { max_attempts: 3, initial: 50ms, factor: 2, max: 100ms }",
	} {
		if !strings.Contains(example, old) {
			t.Fatalf("the example saga no longer holds %q: update this test", old)
		}
		example = strings.ReplaceAll(example, old, repl)
	}
	byID := strings.NewReplacer("saga: order_fulfilment", "saga: order_by_charge_id", "event_type: order.placed", "event_type: order.placed.legacy").Replace(example)
	i := strings.Index(byID, "    compensate:                       # by the charge's key")
	j := strings.Index(byID, "  - name: ship")
	if i < 0 || j < i {
		t.Fatal("the example saga's refund is not where this test expects it: update this test")
	}
	byID = byID[:i] + "    compensate:\n      http: { method: POST, url: \"${ '" + base + "/charges/' + steps.charge_payment.charge_id + '/refund' }\" }\n" + byID[j:]
	dir := t.TempDir()
	for name, b := range map[string]string{"order_fulfilment.yaml": example, "order_by_charge_id.yaml": byID} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	p := relaytest.Start(t, []string{"RELAY_SECRET_PAYMENTS_TOKEN=" + token}, relayArgs(db, "--sagas", dir)...)

	place := func(eventType string) (uuid.UUID, uuid.UUID) {
		t.Helper()
		order, event := uuid.New(), uuid.New()
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id) VALUES ($1)`, order); err != nil {
			t.Fatal(err)
		}
		if err := outbox.Write(ctx, tx, outbox.Message{ID: event, AggregateType: "order", AggregateID: order.String(), EventType: eventType,
			Payload: map[string]any{"order_id": order.String(), "sku": "apple", "qty": 1, "cents": 6666}}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return order, event
	}
	order, event := place("order.placed")
	legacyOrder, legacy := place("order.placed.legacy")
	ended := func(ev uuid.UUID) bool {
		st := statusOf(t, db, ev)
		return st == "COMPENSATED" || st == "FAILED" || st == "COMPLETED"
	}
	testkit.WaitFor(t, 90*time.Second, "both sagas to end", func() bool { return ended(event) && ended(legacy) })

	if st := statusOf(t, db, event); st != "COMPENSATED" {
		t.Errorf("the example's timed-out charge: %s, want COMPENSATED\n%s", st, p.Output())
	}
	s := stats()
	charged, _ := s["charged_orders"].(map[string]any)
	if charged[order.String()] != float64(1) || charged[legacyOrder.String()] != float64(1) {
		t.Errorf("charges per order: %v, want one each (the service acted on both)", charged)
	}
	if s["refunds"] != float64(1) {
		t.Errorf("refunds: %v, want 1: the example's timed-out charge is refunded, the legacy one is not", s["refunds"])
	}
	var reserved int
	if err := db.Pool.QueryRow(ctx, `SELECT reserved FROM stock WHERE sku = 'apple'`).Scan(&reserved); err != nil || reserved != 1 {
		t.Errorf("apple reserved %d (%v), want 1: the example's reservation released, the legacy one kept", reserved, err)
	}
	var st, lastErr string
	if err := db.Pool.QueryRow(ctx, `SELECT status::text, coalesce(last_error, '') FROM saga_instances WHERE trigger_event_id = $1`, legacy).Scan(&st, &lastErr); err != nil {
		t.Fatal(err)
	}
	if st != "FAILED" || !strings.Contains(lastErr, "never recorded") || !strings.Contains(lastErr, "step.idempotency_key") {
		t.Errorf("a compensation that needs the output its step never recorded: %s %q, want FAILED naming step.idempotency_key", st, lastErr)
	}
}
