// Command run is `make example-orders`: it starts a throwaway PostgreSQL, the
// Python payment service (examples/orders/payments.py), the Python shipping
// service (examples/orders/shipping.py) and the relay with --sagas
// examples/orders/sagas --sinks examples/orders/sinks.yaml, places orders
// (some declined, one whose stock runs out), and prints what happened to
// each, as `relay demo` does. The saga's ship step is a command that the
// webhook sink delivers to the shipping service, which replies through the
// relay's POST /v1/events.
package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/internal/pgcluster"
	"github.com/compensa/compensa/internal/pgcluster/pgdocker"
	"github.com/compensa/compensa/migrations"
	"github.com/compensa/compensa/outbox"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "example-orders:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	root := "."
	relayBin := filepath.Join(root, "bin", "relay")
	if _, err := os.Stat(relayBin); err != nil {
		return fmt.Errorf("%s: %v; run make build first (make example-orders does)", relayBin, err)
	}
	fmt.Println("starting PostgreSQL …")
	c, err := pgdocker.Start(ctx, pgcluster.Options{})
	if err != nil {
		return err
	}
	defer c.Stop()
	pool, err := pgxpool.New(ctx, c.URL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := migrations.Apply(ctx, pool, migrations.Options{}); err != nil {
		return err
	}
	schema, err := os.ReadFile(filepath.Join(root, "examples", "orders", "schema.sql"))
	if err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, string(schema)); err != nil {
		return fmt.Errorf("schema.sql: %w", err)
	}

	token := uuid.NewString()
	fmt.Println("starting the payment service (python3 examples/orders/payments.py 8099) …")
	pay := exec.Command("python3", filepath.Join(root, "examples", "orders", "payments.py"), "8099")
	pay.Env = append(os.Environ(), "PAYMENTS_TOKEN="+token)
	pay.Stderr = os.Stderr
	if err := pay.Start(); err != nil {
		return fmt.Errorf("python3: %w", err)
	}
	defer func() { _ = pay.Process.Kill(); _ = pay.Wait() }()

	// The webhook sink signs with this secret; the shipping service verifies
	// with it and replies with the relay's API token.
	relayAddr := "127.0.0.1:8097"
	webhookSecret := "whsec_" + base64.StdEncoding.EncodeToString(randomBytes(32))
	apiToken := hex.EncodeToString(randomBytes(32))
	fmt.Println("starting the shipping service (python3 examples/orders/shipping.py 8098) …")
	ship := exec.Command("python3", filepath.Join(root, "examples", "orders", "shipping.py"), "8098")
	ship.Env = append(os.Environ(), "SHIPPING_WEBHOOK_SECRET="+webhookSecret, "RELAY_URL=http://"+relayAddr, "RELAY_API_TOKEN="+apiToken)
	ship.Stderr = os.Stderr
	if err := ship.Start(); err != nil {
		return fmt.Errorf("python3: %w", err)
	}
	defer func() { _ = ship.Process.Kill(); _ = ship.Wait() }()

	fmt.Println("starting the relay with --sagas examples/orders/sagas --sinks examples/orders/sinks.yaml …")
	logf, err := os.CreateTemp("", "example-orders-relay-*.log")
	if err != nil {
		return err
	}
	relay := exec.Command(relayBin, "run", "--database-url", c.URL, "--sagas", filepath.Join(root, "examples", "orders", "sagas"),
		"--sinks", filepath.Join(root, "examples", "orders", "sinks.yaml"),
		"--http-addr", relayAddr, "--status-interval", "200ms")
	relay.Env = append(os.Environ(), "RELAY_SECRET_PAYMENTS_TOKEN="+token, "SHIPPING_WEBHOOK_SECRET="+webhookSecret, "RELAY_API_TOKEN="+apiToken)
	relay.Stdout, relay.Stderr = logf, logf
	if err := relay.Start(); err != nil {
		return err
	}
	defer func() {
		_ = relay.Process.Signal(os.Interrupt)
		_ = relay.Wait()
		fmt.Println("relay log:", logf.Name())
	}()

	type order struct {
		id         uuid.UUID
		sku        string
		qty, cents int
		note       string
	}
	orders := []order{
		{uuid.New(), "apple", 2, 1250, "accepted"},
		{uuid.New(), "pear", 1, 400, "accepted"},
		{uuid.New(), "apple", 1, 25000, "declined by the payment service (over 10000 cents)"},
		{uuid.New(), "pear", 500, 900, "not enough stock"},
		{uuid.New(), "apple", 3, 3000, "accepted"},
		{uuid.New(), "pear", 2, 15000, "declined by the payment service (over 10000 cents)"},
	}
	for _, o := range orders {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id) VALUES ($1)`, o.id); err != nil {
			return err
		}
		if err := outbox.Write(ctx, tx, outbox.Message{AggregateType: "order", AggregateID: o.id.String(), EventType: "order.placed",
			Payload: map[string]any{"order_id": o.id.String(), "sku": o.sku, "qty": o.qty, "cents": o.cents}}); err != nil {
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
	}
	fmt.Printf("placed %d orders; waiting for their sagas …\n\n", len(orders))
	for {
		var open int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM orders o LEFT JOIN saga_instances i ON i.context->'trigger'->'payload'->>'order_id' = o.id::text
			WHERE i.status IS NULL OR i.status NOT IN ('COMPLETED', 'COMPENSATED', 'FAILED')`).Scan(&open); err != nil {
			return err
		}
		if open == 0 {
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("sagas still open after 5 minutes; see the relay log %s", logf.Name())
		}
		time.Sleep(200 * time.Millisecond)
	}
	fmt.Printf("%-38s %-6s %4s %7s  %-12s %-10s %-13s %s\n", "order", "sku", "qty", "cents", "saga", "order", "tracking", "expected")
	unexpected := 0
	for _, o := range orders {
		var st, ost, why, tracking string
		_ = pool.QueryRow(ctx, `SELECT i.status::text, coalesce(i.compensation_reason, ''), o.status, coalesce(o.tracking, '-') FROM saga_instances i JOIN orders o ON o.id = $1
			WHERE i.context->'trigger'->'payload'->>'order_id' = $1::text`, o.id).Scan(&st, &why, &ost, &tracking)
		fmt.Printf("%-38s %-6s %4d %7d  %-12s %-10s %-13s %s\n", o.id, o.sku, o.qty, o.cents, st, ost, tracking, o.note)
		// The example checks itself: accepted orders complete through the
		// shipping service's reply; the others are compensated.
		accepted := o.note == "accepted"
		if accepted && (st != "COMPLETED" || ost != "CONFIRMED" || !strings.HasPrefix(tracking, "TRK-")) || !accepted && st != "COMPENSATED" {
			unexpected++
		}
		if why != "" {
			fmt.Printf("    why: %s\n", strings.TrimSpace(why))
		}
	}
	rows, err := pool.Query(ctx, `SELECT sku, on_hand, reserved FROM stock ORDER BY sku`)
	if err != nil {
		return err
	}
	fmt.Println("\nstock:")
	for rows.Next() {
		var sku string
		var onHand, reserved int
		_ = rows.Scan(&sku, &onHand, &reserved)
		fmt.Printf("  %-6s on hand %d, reserved %d\n", sku, onHand, reserved)
	}
	rows.Close()
	resp, err := http.Get("http://127.0.0.1:8099/stats")
	if err != nil {
		return err
	}
	var stats map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&stats)
	resp.Body.Close()
	fmt.Printf("\npayment service: %v charges, %v declined, %v refunds, %v retries deduplicated by Idempotency-Key\n",
		stats["charges"], stats["declined"], stats["refunds"], stats["retries_deduplicated"])
	resp, err = http.Get("http://127.0.0.1:8098/stats")
	if err != nil {
		return err
	}
	var shipStats map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&shipStats)
	resp.Body.Close()
	fmt.Printf("shipping service: %v commands received through the webhook sink (%v bad signatures), %v replies posted to POST /v1/events\n",
		shipStats["commands"], shipStats["bad_signatures"], shipStats["replies"])
	var confirmed int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE event_type = 'order.confirmed'`).Scan(&confirmed)
	fmt.Printf("order.confirmed events written: %d\n", confirmed)
	if unexpected > 0 {
		return fmt.Errorf("%d orders did not end as expected; see the relay log %s", unexpected, logf.Name())
	}
	return nil
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return b
}
