// Command embedded is a small shop service that runs Compensa inside its own
// process: an HTTP endpoint places an order and writes its outbox row in the
// same transaction, a two-step saga (reserve the stock, charge the payment)
// fulfils it and compensates the reservation when the payment is declined, and
// the relay that streams the outbox and runs the saga is embedded with
// relay.New. See README.md and docs/producers.md.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/migrations"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/relay"
	"github.com/compensa/compensa/saga"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "embedded:", err)
		os.Exit(1)
	}
}

func run() error {
	dsn := os.Getenv("DATABASE_URL")
	if dsn == "" {
		return errors.New("set DATABASE_URL to a PostgreSQL with wal_level=logical")
	}
	addr := os.Getenv("ADDR")
	if addr == "" {
		addr = "127.0.0.1:8090"
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))

	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	// The relay's schema first, then the shop's own.
	if _, err := migrations.Apply(ctx, pool, migrations.Options{}); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, shopSchema); err != nil {
		return fmt.Errorf("shop schema: %w", err)
	}

	reg := saga.NewRegistry()
	if err := reg.Register(fulfilment); err != nil {
		return err
	}
	r, err := relay.New(ctx, relay.Config{
		DatabaseURL: dsn,
		Registry:    reg,
		Logger:      log,
		// No HTTPAddr: the shop mounts the relay's monitor on its own server.
	})
	if err != nil {
		return err
	}
	if err := r.Start(ctx); err != nil {
		return err
	}

	mux := http.NewServeMux()
	shop := &shop{pool: pool}
	mux.HandleFunc("POST /orders", shop.placeOrder)
	mux.HandleFunc("GET /orders/{id}", shop.getOrder)
	mux.Handle("/relay/", http.StripPrefix("/relay", r.Handler()))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	log.Info("shop listening", "addr", ln.Addr().String())

	select {
	case <-ctx.Done():
	case <-r.Done(): // the stream stopped on a fatal error (a lost slot, say)
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv.Shutdown(stopCtx)
	if err := r.Stop(stopCtx); err != nil {
		return err
	}
	return r.Err()
}

// shopSchema is the shop's own tables. An application would keep them in its
// own migrations.
const shopSchema = `
CREATE TABLE IF NOT EXISTS shop_orders (
    id          uuid PRIMARY KEY,
    sku         text NOT NULL,
    quantity    integer NOT NULL CHECK (quantity > 0),
    total_cents bigint NOT NULL CHECK (total_cents >= 0),
    status      text NOT NULL DEFAULT 'placed',
    reason      text
);
CREATE TABLE IF NOT EXISTS shop_stock (
    sku       text PRIMARY KEY,
    available integer NOT NULL CHECK (available >= 0)
);
CREATE TABLE IF NOT EXISTS shop_payments (
    order_id     uuid PRIMARY KEY REFERENCES shop_orders (id),
    amount_cents bigint NOT NULL
);
INSERT INTO shop_stock (sku, available) VALUES ('tea', 100), ('coffee', 100) ON CONFLICT DO NOTHING;`

// order is the saga's state, decoded from the order.placed payload.
type order struct {
	OrderID    uuid.UUID `json:"order_id"`
	SKU        string    `json:"sku"`
	Quantity   int       `json:"quantity"`
	TotalCents int64     `json:"total_cents"`
}

// creditLimitCents is the payment provider of this example: it declines any
// order above it.
const creditLimitCents = 100_00

// fulfilment reserves the stock, then charges the payment. A declined
// payment fails for good, so the reservation is compensated: the stock goes
// back and the order ends cancelled.
var fulfilment = saga.Define(saga.TypedDefinition[order]{
	Name:     "order_fulfilment",
	Version:  1,
	Triggers: []saga.Trigger{{EventType: "order.placed"}},
	Check: func(o *order) error {
		if o.OrderID == uuid.Nil || o.SKU == "" || o.Quantity <= 0 {
			return errors.New("order_id, sku and a positive quantity are required")
		}
		return nil
	},
	Steps: []saga.TypedStep[order]{
		{
			Name: "reserve_stock",
			Do: func(ctx context.Context, o *order, x *saga.StepTx) error {
				tag, err := x.Tx.Exec(ctx, `UPDATE shop_stock SET available = available - $2 WHERE sku = $1 AND available >= $2`, o.SKU, o.Quantity)
				if err != nil {
					return err
				}
				if tag.RowsAffected() == 0 {
					return saga.Permanent(fmt.Errorf("not enough %s in stock", o.SKU))
				}
				_, err = x.Tx.Exec(ctx, `UPDATE shop_orders SET status = 'reserved' WHERE id = $1`, o.OrderID)
				return err
			},
			Compensate: func(ctx context.Context, o order, x *saga.StepTx) error {
				if _, err := x.Tx.Exec(ctx, `UPDATE shop_stock SET available = available + $2 WHERE sku = $1`, o.SKU, o.Quantity); err != nil {
					return err
				}
				_, err := x.Tx.Exec(ctx, `UPDATE shop_orders SET status = 'cancelled' WHERE id = $1`, o.OrderID)
				return err
			},
		},
		{
			Name: "charge_payment",
			Do: func(ctx context.Context, o *order, x *saga.StepTx) error {
				if o.TotalCents > creditLimitCents {
					if _, err := x.Tx.Exec(ctx, `UPDATE shop_orders SET reason = 'payment declined' WHERE id = $1`, o.OrderID); err != nil {
						return err
					}
					return saga.Permanent(errors.New("payment declined: over the credit limit"))
				}
				if _, err := x.Tx.Exec(ctx, `INSERT INTO shop_payments (order_id, amount_cents) VALUES ($1, $2)`, o.OrderID, o.TotalCents); err != nil {
					return err
				}
				if _, err := x.Tx.Exec(ctx, `UPDATE shop_orders SET status = 'confirmed' WHERE id = $1`, o.OrderID); err != nil {
					return err
				}
				// The confirmation leaves through the outbox, in this
				// step's transaction.
				return x.Emit(ctx, outbox.Message{TenantID: x.Instance.TenantID, AggregateType: "order",
					AggregateID: o.OrderID.String(), EventType: "order.confirmed", Payload: o})
			},
		},
	},
})

type shop struct{ pool *pgxpool.Pool }

// placeOrder writes the order and its order.placed event in one transaction:
// the saga starts exactly when the order exists.
func (s *shop) placeOrder(w http.ResponseWriter, r *http.Request) {
	var o order
	if err := json.NewDecoder(r.Body).Decode(&o); err != nil || o.SKU == "" || o.Quantity <= 0 || o.TotalCents < 0 {
		http.Error(w, `{"error": "want {\"sku\": \"tea\", \"quantity\": 2, \"total_cents\": 1200}"}`, http.StatusBadRequest)
		return
	}
	o.OrderID = uuid.New()
	err := pgx.BeginFunc(r.Context(), s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(r.Context(), `INSERT INTO shop_orders (id, sku, quantity, total_cents) VALUES ($1, $2, $3, $4)`,
			o.OrderID, o.SKU, o.Quantity, o.TotalCents); err != nil {
			return err
		}
		return outbox.Write(r.Context(), tx, outbox.Message{AggregateType: "order", AggregateID: o.OrderID.String(),
			EventType: "order.placed", Payload: o})
	})
	if err != nil {
		http.Error(w, `{"error": "could not place the order"}`, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(map[string]any{"order_id": o.OrderID})
}

func (s *shop) getOrder(w http.ResponseWriter, r *http.Request) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		http.Error(w, `{"error": "not an order id"}`, http.StatusBadRequest)
		return
	}
	var status string
	var reason *string
	err = s.pool.QueryRow(r.Context(), `SELECT status, reason FROM shop_orders WHERE id = $1`, id).Scan(&status, &reason)
	if errors.Is(err, pgx.ErrNoRows) {
		http.Error(w, `{"error": "no such order"}`, http.StatusNotFound)
		return
	}
	if err != nil {
		http.Error(w, `{"error": "could not read the order"}`, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"order_id": id, "status": status, "reason": reason})
}
