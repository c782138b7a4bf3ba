package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

// TestDeclaredOrdersSurviveKills places orders while the relay is killed
// with SIGKILL and restarted: the stock arithmetic is exact, every order is
// charged at most once as the service's deduplication sees it (exactly once
// when it was not declined), and no step's Idempotency-Key differs between
// its attempts. `make test` runs one kill and 30 orders; `make
// test-declared` (RELAY_TEST_HEAVY=1) runs three kills and 300 orders.
func TestDeclaredOrdersSurviveKills(t *testing.T) {
	t.Parallel()
	kills, n := 1, 30
	if testkit.Heavy() {
		kills, n = 3, 300
	}
	db := pgtest.NewDB(t)
	if _, err := db.Pool.Exec(context.Background(), ordersSchema); err != nil {
		t.Fatal(err)
	}
	pay := newPayments()
	pay.delay = 20 * time.Millisecond // calls in flight when the kill comes
	srv := newServer(pay)
	defer srv.Close()
	dir := t.TempDir()
	writeSaga(t, dir, "order_fulfilment.yaml", orderSaga, srv.URL)
	env := []string{"RELAY_SECRET_PAYMENTS_TOKEN=" + plantedSecret}
	args := relayArgs(db, "--sagas", dir, "--lease", "2s")

	p := relaytest.Start(t, env, args...)
	var orders []order
	perRound := n / (kills + 1)
	for round := 0; round <= kills; round++ {
		for i := 0; i < perRound; i++ {
			k := len(orders)
			o := order{id: uuid.New(), event: uuid.New(), sku: "apple", qty: 1 + k%3, cents: 500}
			switch k % 5 {
			case 1:
				o.cents = 20000
			case 2:
				o.blocked = true
			}
			if k%2 == 1 {
				o.sku = "pear"
			}
			orders = append(orders, o)
			placeOrder(t, db, o)
			time.Sleep(10 * time.Millisecond)
		}
		if round < kills {
			p.Kill()
			p = relaytest.Start(t, env, args...)
		}
	}
	testkit.WaitFor(t, 3*time.Minute, "every order's saga to end", func() bool {
		return count(t, db, `SELECT count(*) FROM saga_instances WHERE status IN ('COMPLETED', 'COMPENSATED')`) == len(orders)
	})
	p.Stop(30 * time.Second)

	reserved := map[string]int{}
	pay.mu.Lock()
	defer pay.mu.Unlock()
	for _, o := range orders {
		st := statusOf(t, db, o.event)
		charged, keys := pay.byOrder[o.id.String()], len(pay.keys[o.id.String()])
		if keys != 1 {
			t.Errorf("order %s: %d different Idempotency-Keys; want 1", o.id, keys)
		}
		switch {
		case o.cents > 10000:
			if st != "COMPENSATED" || charged != 0 {
				t.Errorf("declined order %s: %s, charged %d", o.id, st, charged)
			}
		case o.blocked:
			if st != "COMPENSATED" || charged != 1 || pay.refunds[chargeOf(pay, o)] == 0 {
				t.Errorf("blocked order %s: %s, charged %d, refunds %d", o.id, st, charged, pay.refunds[chargeOf(pay, o)])
			}
		default:
			if st != "COMPLETED" || charged != 1 {
				t.Errorf("accepted order %s: %s, charged %d", o.id, st, charged)
			}
			reserved[o.sku] += o.qty
		}
	}
	for _, sku := range []string{"apple", "pear"} {
		if got := count(t, db, `SELECT reserved FROM stock WHERE sku = $1`, sku); got != reserved[sku] {
			t.Errorf("stock %s reserved %d; want %d", sku, got, reserved[sku])
		}
	}
	if len(pay.bad) > 0 {
		t.Errorf("bad requests: %v", pay.bad)
	}
	t.Logf("%d orders, %d kills: stock exact, one charge per accepted order, one Idempotency-Key per step", len(orders), kills)
}
