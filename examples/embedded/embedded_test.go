package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// The example service, built and run as a user would, against a real
// PostgreSQL: an order within the credit limit is confirmed, one above it is
// cancelled and its stock reservation compensated, and SIGTERM stops it
// cleanly.
func TestEmbeddedShopFulfilsAndCompensates(t *testing.T) {
	testkit.SkipShort(t, "runs the embedded example end to end")
	db := pgtest.NewEmptyDB(t)
	bin := filepath.Join(t.TempDir(), "embedded")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var logs syncBuffer
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+db.URL, "ADDR="+addr)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var exitErr error
	go func() { exitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			cmd.Process.Kill()
			select {
			case <-exited:
			case <-time.After(10 * time.Second):
				t.Errorf("the shop (pid %d) did not exit after SIGKILL", cmd.Process.Pid)
			}
		}
		if t.Failed() {
			t.Logf("shop output:\n%s", logs.String())
		}
	})
	base := "http://" + addr
	http.DefaultClient.Timeout = 10 * time.Second
	testkit.WaitFor(t, 60*time.Second, "the shop to serve the relay's /healthz", func() bool {
		resp, err := http.Get(base + "/relay/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})

	place := func(body string) string {
		resp, err := http.Post(base+"/orders", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			OrderID string `json:"order_id"`
		}
		if resp.StatusCode != http.StatusCreated || json.NewDecoder(resp.Body).Decode(&out) != nil {
			t.Fatalf("POST /orders %s: %d", body, resp.StatusCode)
		}
		return out.OrderID
	}
	status := func(id string) string {
		resp, err := http.Get(base + "/orders/" + id)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			Status string `json:"status"`
		}
		json.NewDecoder(resp.Body).Decode(&out)
		return out.Status
	}
	tea := place(`{"sku": "tea", "quantity": 2, "total_cents": 1200}`)
	coffee := place(`{"sku": "coffee", "quantity": 1, "total_cents": 50000}`)
	testkit.WaitFor(t, 60*time.Second, "the tea order to be confirmed and the coffee order cancelled", func() bool {
		return status(tea) == "confirmed" && status(coffee) == "cancelled"
	})

	conn, err := pgx.Connect(context.Background(), db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var teaLeft, coffeeLeft, payments, confirmedEvents int
	conn.QueryRow(context.Background(), `SELECT
		(SELECT available FROM shop_stock WHERE sku = 'tea'),
		(SELECT available FROM shop_stock WHERE sku = 'coffee'),
		(SELECT count(*) FROM shop_payments),
		(SELECT count(*) FROM outbox WHERE event_type = 'order.confirmed')`).Scan(&teaLeft, &coffeeLeft, &payments, &confirmedEvents)
	if teaLeft != 98 || coffeeLeft != 100 || payments != 1 || confirmedEvents != 1 {
		t.Fatalf("stock tea %d coffee %d, payments %d, order.confirmed events %d; want 98 100 1 1", teaLeft, coffeeLeft, payments, confirmedEvents)
	}
	var sagaStatus string
	conn.QueryRow(context.Background(), `SELECT status::text FROM saga_instances i JOIN outbox o ON o.id = i.trigger_event_id
		WHERE o.aggregate_id = $1`, coffee).Scan(&sagaStatus)
	if sagaStatus != "COMPENSATED" {
		t.Fatalf("the coffee order's saga is %q, want COMPENSATED", sagaStatus)
	}

	resp, err := http.Get(base + "/relay/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(metrics), `compensa_events_total{outcome="started"} 2`) {
		t.Errorf("the mounted monitor's metrics lack two started events:\n%s", grepLines(string(metrics), "compensa_events_total"))
	}

	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		if exitErr != nil {
			t.Fatalf("the shop exited with %v after SIGTERM\n%s", exitErr, logs.String())
		}
	case <-time.After(40 * time.Second):
		t.Fatalf("the shop did not stop within 40s of SIGTERM\n%s", logs.String())
	}
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// syncBuffer is a bytes.Buffer safe for the process's writes and the test's
// reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
