package relay_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/relay"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/test/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// orderSaga is a two-step saga whose steps write to a table of the test's
// own, so that the test sees exactly what ran.
type orderState struct {
	OrderID string `json:"order_id"`
}

func orderRegistry(t *testing.T) *saga.Registry {
	t.Helper()
	reg := saga.NewRegistry()
	step := func(name string) saga.TypedStep[orderState] {
		return saga.TypedStep[orderState]{
			Name: name,
			Do: func(ctx context.Context, s *orderState, x *saga.StepTx) error {
				_, err := x.Tx.Exec(ctx, `INSERT INTO relay_test_steps (order_id, step) VALUES ($1, $2)`, s.OrderID, name)
				return err
			},
		}
	}
	err := reg.Register(saga.Define(saga.TypedDefinition[orderState]{
		Name: "order", Version: 1,
		Triggers: []saga.Trigger{{EventType: "order.placed"}},
		Steps:    []saga.TypedStep[orderState]{step("reserve"), step("confirm")},
	}))
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

func TestNewRejectsAnIncompleteConfig(t *testing.T) {
	t.Parallel()
	_, err := relay.New(context.Background(), relay.Config{Workers: -1})
	if !errors.Is(err, saga.ErrInvalid) {
		t.Fatalf("err = %v, want saga.ErrInvalid", err)
	}
	for _, want := range []string{"DatabaseURL", "Registry", "Workers"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
}

// TestEmbeddedRelayRunsASaga is the library's promise end to end: an outbox
// row committed by the application starts the saga registered in Go, and both
// steps run, with the monitor mounted on the application's own server.
func TestEmbeddedRelayRunsASaga(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := t.Context()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE relay_test_steps (order_id text, step text)`); err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(ctx, relay.Config{
		DatabaseURL: db.URL, Registry: orderRegistry(t), Slot: db.Slot, Publication: db.Publication,
		Workers: 2, StatusInterval: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			r.Stop(context.Background())
		}
	})
	if r.Addr() != "" {
		t.Fatalf("Addr = %q with no HTTPAddr, want empty", r.Addr())
	}
	srv := httptest.NewServer(r.Handler())
	defer srv.Close()

	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		return outbox.Write(ctx, tx, outbox.Message{
			AggregateType: "order", AggregateID: "o-1", EventType: "order.placed",
			Payload: map[string]string{"order_id": "o-1"},
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM relay_test_steps WHERE order_id = 'o-1'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30s, %d of 2 steps ran", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var status string
	if err := db.Pool.QueryRow(ctx, `SELECT status FROM saga_instances WHERE saga_name = 'order'`).Scan(&status); err != nil {
		t.Fatal(err)
	}
	if status != string(saga.StatusCompleted) {
		t.Fatalf("status = %s, want %s", status, saga.StatusCompleted)
	}

	resp, err := http.Get(srv.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz on the mounted handler: %d %s", resp.StatusCode, body)
	}

	if err := r.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	stopped = true
	if err := r.Stop(ctx); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	select {
	case <-r.Done():
	default:
		t.Fatal("Done not closed after Stop")
	}
	if err := r.Err(); err != nil {
		t.Fatalf("Err after a clean Stop = %v", err)
	}
}

// TestNewReportsAMissingOutboxTable checks that a preflight failure comes
// back from New, typed, before anything starts.
func TestNewReportsAMissingOutboxTable(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	_, err := relay.New(t.Context(), relay.Config{
		DatabaseURL: db.URL, Registry: saga.NewRegistry(), Slot: db.Slot, Publication: db.Publication,
		OutboxTable: "no_such_outbox",
	})
	if !errors.Is(err, relay.ErrOutboxTable) {
		t.Fatalf("err = %v, want relay.ErrOutboxTable", err)
	}
}

func TestStartListensAndStops(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := t.Context()
	r, err := relay.New(ctx, relay.Config{
		DatabaseURL: db.URL, Registry: saga.NewRegistry(), Slot: db.Slot, Publication: db.Publication,
		HTTPAddr: "127.0.0.1:0", NoStream: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); !errors.Is(err, saga.ErrInvalid) {
		t.Errorf("second Start: err = %v, want saga.ErrInvalid", err)
	}
	resp, err := http.Get("http://" + r.Addr() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz: %d", resp.StatusCode)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Stop(sctx); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get("http://" + r.Addr() + "/healthz"); err == nil {
		t.Fatal("the monitor still answers after Stop")
	}
}

// TestProbesAnswerUnderAConnectionFlood: 300 connections that never finish
// their headers fill the monitor's connection cap (its /healthz answers
// 503), while the probe listener (ProbeAddr) keeps answering 200.
func TestProbesAnswerUnderAConnectionFlood(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := t.Context()
	r, err := relay.New(ctx, relay.Config{
		DatabaseURL: db.URL, Registry: saga.NewRegistry(), Slot: db.Slot, Publication: db.Publication,
		HTTPAddr: "127.0.0.1:0", ProbeAddr: "127.0.0.1:0", NoStream: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r.Stop(sctx)
	}()
	var flood []net.Conn
	defer func() {
		for _, c := range flood {
			c.Close()
		}
	}()
	for range 300 {
		c, err := net.Dial("tcp", r.Addr())
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n")) // never finished
		flood = append(flood, c)
	}
	time.Sleep(300 * time.Millisecond)
	get := func(addr, path string) int {
		c := &http.Client{Timeout: 5 * time.Second}
		resp, err := c.Get("http://" + addr + path)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(r.Addr(), "/healthz"); code == http.StatusOK {
		t.Fatal("the flood did not fill the monitor's connection cap: the test proves nothing")
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if code := get(r.ProbeAddr(), path); code != http.StatusOK {
			t.Errorf("%s on the probe listener under a flood of 300 connections: %d, want 200", path, code)
		}
	}
	if code := get(r.ProbeAddr(), "/v1/sagas"); code != http.StatusNotFound {
		t.Errorf("the probe listener serves /v1/sagas: %d, want 404", code)
	}
}
