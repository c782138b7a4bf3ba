package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/compensa/compensa/test/natstest"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

// grantedRole creates a LOGIN role with nothing else (no REPLICATION, no
// grant), dropped with the test's database, and returns its name and a URL
// that connects as it.
func grantedRole(t *testing.T, db *pgtest.DB, password string) (string, string) {
	t.Helper()
	ctx := context.Background()
	role := "relay_" + db.Name
	if _, err := db.Pool.Exec(ctx, fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD '%s'`, role, password)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Roles are cluster-wide: drop it once its database is gone.
		ctx := context.Background()
		pgtest.Drop(db.Cluster, db.Name)
		if admin, err := pgx.Connect(ctx, db.Cluster.URL); err == nil {
			admin.Exec(ctx, fmt.Sprintf(`DROP ROLE IF EXISTS %s`, role))
			admin.Close(ctx)
		}
	})
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, password)
	return role, u.String()
}

// grantSaga is a declared saga whose steps touch the application's tables
// and a payment service; with the service down, its compensation fails too
// and the instance ends FAILED, for an operator to retry in bulk.
const grantSaga = `saga: grant_check
version: 1
triggers:
  - event_type: order.placed
defaults:
  timeout: 5s
  retry: { max_attempts: 2, initial: 50ms, factor: 2, max: 100ms }
  compensation_retry: { max_attempts: 2, initial: 50ms, factor: 2, max: 100ms }
steps:
  - name: reserve_stock
    sql:
      query: UPDATE stock SET reserved = reserved + 1 WHERE sku = $1 RETURNING sku
      params: ["${ trigger.payload.sku }"]
      expect: one_row
    compensate:
      sql:
        query: UPDATE stock SET reserved = reserved - 1 WHERE sku = $1
        params: ["${ trigger.payload.sku }"]
  - name: charge
    http:
      method: POST
      url: "PAYSVC/charges"
      body: { order_id: "${ trigger.payload.order_id }" }
    compensate:
      http: { method: POST, url: "PAYSVC/refunds", body: { order_id: "${ trigger.payload.order_id }" } }
  - name: confirm
    sql:
      query: UPDATE orders SET status = 'CONFIRMED' WHERE id = $1::uuid
      params: ["${ trigger.payload.order_id }"]
      expect: one_row
    emit:
      - event_type: order.confirmed
        aggregate_type: order
        aggregate_id: "${ trigger.aggregate_id }"
        payload: { order_id: "${ trigger.payload.order_id }" }
`

// switchable answers 503 while down, 200 otherwise, and records the ids of
// what it accepted (the webhook-id header, or the path for a service).
type switchable struct {
	down atomic.Bool
	mu   sync.Mutex
	ids  map[string]int
}

func newSwitchable() *switchable { return &switchable{ids: map[string]int{}} }

func (s *switchable) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	if s.down.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	s.mu.Lock()
	s.ids[r.Header.Get("webhook-id")+r.URL.Path]++
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, `{"ok": true}`)
}

func (s *switchable) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ids)
}

// startNATS runs an embedded nats-server with JetStream for the test.
func startNATS(t *testing.T) string { return natstest.Start(t).URL() }

// outageLength is how long the webhook stays down: a few seconds in a normal
// run, COMPENSA_GRANT_OUTAGE (e.g. 30s) for the long one.
func outageLength(t *testing.T) time.Duration {
	v := os.Getenv("COMPENSA_GRANT_OUTAGE")
	if v == "" {
		return 3 * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("COMPENSA_GRANT_OUTAGE=%q: %v", v, err)
	}
	return d
}

// The relay runs as a LOGIN role that got nothing but `relay migrate
// --grant-to` (and the application's grants its saga's steps need): declared
// sagas from files, a webhook and a NATS sink, a webhook outage, and a bulk
// retry through a token. Nothing fails for a privilege, and the role's
// password shows up nowhere.
func TestRelayRunsWithOnlyWhatGrantToGave(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	const planted = "Least-Priv_S3cret"
	role, roleURL := grantedRole(t, db, planted)
	if _, err := db.Pool.Exec(ctx, `
CREATE TABLE orders (id uuid PRIMARY KEY, status text NOT NULL DEFAULT 'PLACED');
CREATE TABLE stock (sku text PRIMARY KEY, reserved integer NOT NULL DEFAULT 0);
INSERT INTO stock (sku) VALUES ('apple');`); err != nil {
		t.Fatal(err)
	}

	// As the schema's owner (here the superuser): grant, create the
	// publication, give REPLICATION.
	out, code := relaytest.Run(t, nil, "migrate", "--grant-to", role, "--database-url", db.URL, "--publication", db.Publication)
	if code != 0 || !strings.Contains(out, `GRANT USAGE ON SEQUENCE relay_sink_parked_seq_seq TO "`+role+`";`) ||
		!strings.Contains(out, `ALTER ROLE "`+role+`" REPLICATION;`) || !strings.Contains(out, "created publication "+db.Publication) {
		t.Fatalf("relay migrate --grant-to: code %d\n%s", code, out)
	}
	// What the saga's steps touch is the application's to grant.
	if _, err := db.Pool.Exec(ctx, fmt.Sprintf(`GRANT SELECT, UPDATE ON orders, stock TO %s`, role)); err != nil {
		t.Fatal(err)
	}

	pay, hook := newSwitchable(), newSwitchable()
	paySrv, hookSrv := httptest.NewServer(pay), httptest.NewServer(hook)
	defer paySrv.Close()
	defer hookSrv.Close()
	natsURL := startNATS(t)
	dir := t.TempDir()
	sagas := filepath.Join(dir, "sagas")
	if err := os.Mkdir(sagas, 0o700); err != nil {
		t.Fatal(err)
	}
	writeSaga(t, sagas, "grant_check.yaml", grantSaga, paySrv.URL)
	sinks := filepath.Join(dir, "sinks.yaml")
	writeFile(t, sinks, fmt.Sprintf(`sinks:
  - name: hook
    webhook: { url: %s/events }
  - name: bus
    nats: { url: %q, stream: OUTBOX, subject: "outbox.{event_type}" }
`, hookSrv.URL, natsURL))
	tokens := filepath.Join(dir, "tokens.yaml")
	writeFile(t, tokens, "tokens:\n  - name: ops\n    token_env: GRANT_OPS_TOKEN\n    tenant: \"*\"\n    role: operate\n")
	secret := make([]byte, 16)
	rand.Read(secret)
	token := hex.EncodeToString(secret)

	hook.down.Store(true)
	p := relaytest.Start(t, []string{"GRANT_OPS_TOKEN=" + token},
		"--database-url", roleURL, "--slot", db.Slot, "--publication", db.Publication,
		"--status-interval", "200ms", "--heartbeat-interval", "1s", "--workers", "4",
		"--sagas", sagas, "--sinks", sinks, "--api-tokens", tokens)

	// 1. The webhook is down: orders complete, their events reach NATS and
	//    are parked for the webhook.
	placeOrders := func(n int) []uuid.UUID {
		var events []uuid.UUID
		for range n {
			id, ev := uuid.New(), uuid.New()
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO orders (id) VALUES ($1)`, id); err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
				VALUES ($1, 'order', $2, 'order.placed', $3)`, ev, id.String(), fmt.Sprintf(`{"order_id": %q, "sku": "apple"}`, id)); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			events = append(events, ev)
		}
		return events
	}
	statuses := func(events []uuid.UUID, want string) bool {
		var n int
		db.Pool.QueryRow(ctx, `SELECT count(*) FROM saga_instances WHERE status::text = $1 AND trigger_event_id = ANY($2)`, want, events).Scan(&n)
		return n == len(events)
	}
	outageStart := time.Now()
	done := placeOrders(5)
	testkit.WaitFor(t, 60*time.Second, "5 orders completed while the webhook is down", func() bool { return statuses(done, "COMPLETED") })
	testkit.WaitFor(t, 30*time.Second, "the 10 events (placed, confirmed) parked for the webhook", func() bool {
		var n int
		db.Pool.QueryRow(ctx, `SELECT count(*) FROM relay_sink_parked WHERE sink = 'hook'`).Scan(&n)
		return n == 10
	})
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 30*time.Second, "the 10 events in the NATS stream", func() bool {
		s, err := js.Stream(ctx, "OUTBOX")
		if err != nil {
			return false
		}
		info, err := s.Info(ctx)
		return err == nil && info.State.Msgs == 10
	})

	// 2. The webhook comes back after the outage: every parked event is
	//    delivered.
	if rest := outageLength(t) - time.Since(outageStart); rest > 0 {
		time.Sleep(rest)
	}
	hook.down.Store(false)
	testkit.WaitFor(t, 60*time.Second, "the parked events delivered once the webhook is back", func() bool {
		var n int
		db.Pool.QueryRow(ctx, `SELECT count(*) FROM relay_sink_parked`).Scan(&n)
		return n == 0 && hook.count() == 10
	})

	// 3. The payment service is down: the charge and its refund fail, the
	//    instances end FAILED; once it is back, one bulk retry through the
	//    token compensates them.
	pay.down.Store(true)
	failed := placeOrders(3)
	testkit.WaitFor(t, 60*time.Second, "3 instances FAILED while the payment service is down", func() bool { return statuses(failed, "FAILED") })
	pay.down.Store(false)
	body, _ := json.Marshal(map[string]any{"filter": map[string]any{"saga": "grant_check", "status": "FAILED"},
		"reason": "payments are back", "dry_run": false})
	req, _ := http.NewRequest("POST", "http://"+p.Addr+"/v1/sagas/retry", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var bulk struct {
		Outcomes map[string]int `json:"outcomes"`
	}
	if err := json.Unmarshal(answer, &bulk); resp.StatusCode != 200 || err != nil || bulk.Outcomes["retried"] != 3 {
		t.Fatalf("bulk retry: %d %s", resp.StatusCode, answer)
	}
	testkit.WaitFor(t, 60*time.Second, "the 3 retried instances compensated", func() bool { return statuses(failed, "COMPENSATED") })
	var reserved int
	db.Pool.QueryRow(ctx, `SELECT reserved FROM stock WHERE sku = 'apple'`).Scan(&reserved)
	if reserved != 5 {
		t.Fatalf("stock reserved = %d; want the 5 completed orders' only", reserved)
	}
	testkit.WaitFor(t, 30*time.Second, "every event of the run delivered to the webhook", func() bool {
		var n int
		db.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n)
		return hook.count() == n
	})

	p.Stop(30 * time.Second)
	for _, bad := range []string{"permission denied", "missing privilege", planted} {
		if strings.Contains(p.Output(), bad) {
			t.Fatalf("the relay's output contains %q:\n%s", bad, p.Output())
		}
	}
	t.Logf("webhook outage %s; %d events delivered", outageLength(t), hook.count())
}

// relay run checks, before anything starts, every privilege its flags need
// and names each missing one with the statement that grants it, all at
// once, exit 2. Features whose flags are off ask for nothing.
func TestRelayRunNamesEveryMissingPrivilege(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	role, roleURL := grantedRole(t, db, "role-S3cret")
	if out, code := relaytest.Run(t, nil, "migrate", "--grant-to", role, "--database-url", db.URL, "--publication", db.Publication); code != 0 {
		t.Fatalf("relay migrate --grant-to: code %d\n%s", code, out)
	}
	// One privilege taken from each of four features, and REPLICATION.
	for _, st := range []string{
		`REVOKE USAGE ON SEQUENCE relay_sink_parked_seq_seq FROM ` + role,
		`REVOKE INSERT ON relay_sink_parked FROM ` + role,
		`REVOKE INSERT ON saga_definitions FROM ` + role,
		`REVOKE INSERT ON relay_checkpoints FROM ` + role,
		`REVOKE UPDATE ON saga_steps FROM ` + role,
		`ALTER ROLE ` + role + ` NOREPLICATION`,
	} {
		if _, err := db.Pool.Exec(ctx, st); err != nil {
			t.Fatalf("%s: %v", st, err)
		}
	}
	dir := t.TempDir()
	sinks := filepath.Join(dir, "sinks.yaml")
	writeFile(t, sinks, "sinks:\n  - name: hook\n    webhook: { url: http://127.0.0.1:9/events }\n")
	sagas := filepath.Join(dir, "sagas")
	os.Mkdir(sagas, 0o700)
	writeSaga(t, sagas, "grant_check.yaml", grantSaga, "http://127.0.0.1:9")
	base := []string{"run", "--database-url", roleURL, "--slot", db.Slot, "--publication", db.Publication, "--http-addr", "127.0.0.1:0"}

	out, code := relaytest.Run(t, nil, append(base, "--sinks", sinks, "--sagas", sagas)...)
	want := []string{
		`missing privilege: USAGE on sequence relay_sink_parked_seq_seq, for --sinks (run: relay migrate --grant-to ` + role + `, or GRANT USAGE ON SEQUENCE relay_sink_parked_seq_seq TO "` + role + `")`,
		`missing privilege: INSERT on relay_sink_parked, for --sinks (run: relay migrate --grant-to ` + role + `, or GRANT INSERT ON relay_sink_parked TO "` + role + `")`,
		`missing privilege: INSERT on saga_definitions, for --sagas (run: relay migrate --grant-to ` + role + `, or GRANT INSERT ON saga_definitions TO "` + role + `")`,
		`missing privilege: INSERT on relay_checkpoints, for the stream (run: relay migrate --grant-to ` + role + `, or GRANT INSERT ON relay_checkpoints TO "` + role + `")`,
		`missing privilege: UPDATE on saga_steps, for the step runner and the monitor (run: relay migrate --grant-to ` + role + `, or GRANT UPDATE ON saga_steps TO "` + role + `")`,
		`missing privilege: REPLICATION, for the stream (run: as a superuser: ALTER ROLE "` + role + `" REPLICATION;`,
		`role "` + role + `" lacks 6 privilege(s) relay run needs; nothing was started`,
	}
	if code != 2 {
		t.Fatalf("relay run with missing privileges: exit %d, want 2\n%s", code, out)
	}
	for _, w := range want {
		if !strings.Contains(out, "relay: "+w) {
			t.Errorf("the output does not name %q:\n%s", w, out)
		}
	}
	if strings.Contains(out, "permission denied") || strings.Contains(out, "role-S3cret") {
		t.Fatalf("a bare permission error or the password in the output:\n%s", out)
	}

	// Without --sinks and --sagas, as a --no-stream replica, only the
	// runner's privilege is asked for.
	out, code = relaytest.Run(t, nil, append(base, "--no-stream")...)
	if code != 2 || !strings.Contains(out, "UPDATE on saga_steps") || strings.Contains(out, "relay_sink_parked") ||
		strings.Contains(out, "saga_definitions") || strings.Contains(out, "REPLICATION") || strings.Contains(out, "relay_checkpoints") {
		t.Fatalf("relay run --no-stream: exit %d; want only the runner's missing privilege\n%s", code, out)
	}

	// relay migrate --grant-to gives them back (run by the superuser, it
	// restores REPLICATION too), and the same command starts.
	if out, code := relaytest.Run(t, nil, "migrate", "--grant-to", role, "--database-url", db.URL, "--publication", db.Publication); code != 0 || strings.Count(out, "GRANT ") != 5 || !strings.Contains(out, "REPLICATION;") {
		t.Fatalf("relay migrate --grant-to again: code %d; want the 5 grants and REPLICATION back\n%s", code, out)
	}
	p := relaytest.Start(t, nil, append(base[1:len(base)-2], "--sinks", sinks, "--sagas", sagas, "--status-interval", "200ms")...)
	p.Stop(30 * time.Second)
}

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}
