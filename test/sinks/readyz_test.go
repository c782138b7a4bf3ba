package sinks

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/relay"
	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

// A webhook sink is down and the relay's role loses INSERT on the parked
// table: the sink's events can be neither delivered nor parked. /readyz
// says so within --stall-after, `relay sinks list` shows the sink failing
// with the reason; the GRANT back makes it ready again without a restart,
// and once the endpoint is back every event arrives.
func TestReadyzUnreadyWhileASinkCanNeitherDeliverNorPark(t *testing.T) {
	// Not parallel: the webhook secret is passed through the environment.
	ctx := context.Background()
	db := pgtest.NewDB(t)
	roleName := db.Name + "_relay"
	role := pgx.Identifier{roleName}.Sanitize()
	for _, q := range []string{
		`CREATE ROLE ` + role + ` LOGIN REPLICATION PASSWORD 'sinks-Pw-1'`,
		`GRANT ALL ON ALL TABLES IN SCHEMA public TO ` + role,
		`GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO ` + role,
		`CREATE PUBLICATION ` + pgx.Identifier{db.Publication}.Sanitize() + ` FOR TABLE outbox WITH (publish = 'insert')`,
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		db.Pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, roleName)
		db.Pool.Exec(ctx, `DROP OWNED BY `+role)
		db.Pool.Exec(ctx, `DROP ROLE `+role)
	})
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(roleName, "sinks-Pw-1")

	ep := newEndpoint(t)
	t.Setenv("READYZ_WEBHOOK_SECRET", secret)
	file := filepath.Join(t.TempDir(), "sinks.yaml")
	if err := os.WriteFile(file, []byte(fmt.Sprintf(`sinks:
  - name: hook
    webhook:
      url: %s/events
      secret_env: READYZ_WEBHOOK_SECRET
      timeout: 2s
`, ep.srv.URL)), 0o600); err != nil {
		t.Fatal(err)
	}
	const stallAfter = 2 * time.Second
	r, err := relay.New(ctx, relay.Config{DatabaseURL: u.String(), Registry: checkoutRegistry(), Slot: db.Slot, Publication: db.Publication,
		HTTPAddr: "127.0.0.1:0", Sinks: file, Workers: 2, StallAfter: stallAfter,
		StatusInterval: 100 * time.Millisecond, HeartbeatInterval: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := r.Stop(sctx); err != nil {
			t.Error(err)
		}
	}()
	readyz := func() (int, []string, string) {
		resp, err := http.Get("http://" + r.Addr() + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		var m struct {
			Reasons []string `json:"reasons"`
		}
		json.Unmarshal(body, &m)
		return resp.StatusCode, m.Reasons, string(body)
	}
	hook := func() sink.Status {
		list, err := sink.List(ctx, db.Pool)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range list {
			if s.Name == "hook" {
				return s
			}
		}
		t.Fatal("relay sinks list has no hook")
		return sink.Status{}
	}

	ids, _ := write(t, db, 0, 3, 3)
	testkit.WaitFor(t, 30*time.Second, "the first deliveries", func() bool { return len(ep.ids()) >= 3 })
	if code, _, body := readyz(); code != 200 {
		t.Fatalf("/readyz before the outage: %d %s", code, body)
	}

	ep.status.Store(503)
	more, _ := write(t, db, 3, 2, 3)
	ids = append(ids, more...)
	testkit.WaitFor(t, 30*time.Second, "events parked while the endpoint is down", func() bool {
		return count(t, db, `SELECT count(*) FROM relay_sink_parked WHERE sink = 'hook'`) >= 1
	})

	if _, err := db.Pool.Exec(ctx, `REVOKE INSERT ON relay_sink_parked FROM `+role); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	more, _ = write(t, db, 5, 5, 3)
	ids = append(ids, more...)
	var reasons []string
	var body string
	testkit.WaitFor(t, 20*time.Second, "/readyz unready", func() bool {
		var code int
		code, reasons, body = readyz()
		return code == http.StatusServiceUnavailable
	})
	took := time.Since(revoked)
	t.Logf("unready %s after the revoke: %s", took.Round(10*time.Millisecond), body)
	if took > stallAfter+2*time.Second {
		t.Errorf("unready only %s after the revoke, --stall-after is %s", took, stallAfter)
	}
	joined := strings.Join(reasons, "\n")
	if !strings.Contains(joined, "sink hook: can neither deliver nor park its events") || !strings.Contains(joined, "permission denied for table relay_sink_parked") {
		t.Errorf("/readyz reasons %q: want the sink's, naming the missing privilege", reasons)
	}
	testkit.WaitFor(t, 10*time.Second, "relay sinks list showing the sink failing", func() bool { return hook().State == sink.StateFailing })
	if s := hook(); !strings.Contains(s.Reason, "permission denied for table relay_sink_parked") {
		t.Errorf("relay sinks list: hook is %s with reason %q, want the missing privilege", s.State, s.Reason)
	}

	if _, err := db.Pool.Exec(ctx, `GRANT INSERT ON relay_sink_parked TO `+role); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 40*time.Second, "/readyz ready after the grant", func() bool { code, _, _ := readyz(); return code == 200 })
	testkit.WaitFor(t, 10*time.Second, "the sink no longer failing", func() bool { return hook().State != sink.StateFailing })

	ep.status.Store(0)
	testkit.WaitFor(t, 60*time.Second, "every event delivered", func() bool {
		got := map[string]bool{}
		for _, id := range ep.ids() {
			got[id] = true
		}
		for _, id := range ids {
			if !got[id] {
				return false
			}
		}
		return true
	})
	if n := count(t, db, `SELECT count(*) FROM saga_instances WHERE saga_name = 'placed'`); n != len(ids) {
		t.Errorf("%d sagas started for %d events", n, len(ids))
	}
}
