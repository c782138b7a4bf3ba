package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
)

// The relay runs as the role README.md documents — LOGIN REPLICATION and the
// listed grants, no superuser — and the role's password never shows up.
func TestRelayRunsWithTheDocumentedLeastPrivilege(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	const planted = "Least-Priv_S3cret"
	role := "relay_" + db.Name
	stmts := []string{
		fmt.Sprintf(`CREATE ROLE %s LOGIN REPLICATION PASSWORD '%s'`, role, planted),
		fmt.Sprintf(`GRANT SELECT ON outbox TO %s`, role),
		fmt.Sprintf(`GRANT SELECT, INSERT, UPDATE ON saga_instances, saga_steps, saga_events, relay_checkpoints, relay_dead_letters, relay_inbox TO %s`, role),
		fmt.Sprintf(`GRANT INSERT ON outbox TO %s`, role),
		// The overview's status counts (migration 0006), written by triggers
		// on saga_instances as the relay's role.
		fmt.Sprintf(`GRANT SELECT, INSERT, UPDATE, DELETE ON saga_status_counts, saga_status_deltas TO %s`, role),
		// What the example saga's steps read and write.
		fmt.Sprintf(`GRANT SELECT, UPDATE ON research_briefs TO %s`, role),
		fmt.Sprintf(`GRANT SELECT ON documents TO %s`, role),
		fmt.Sprintf(`GRANT SELECT, INSERT, DELETE ON brief_sources TO %s`, role),
		// The table's owner creates the publication once.
		fmt.Sprintf(`CREATE PUBLICATION %s FOR TABLE outbox WITH (publish = 'insert')`, db.Publication),
	}
	for _, s := range stmts {
		if _, err := db.Pool.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	t.Cleanup(func() {
		// Roles are cluster-wide: drop it once its database is gone.
		ctx := context.Background()
		db.Pool.Exec(ctx, fmt.Sprintf(`DROP OWNED BY %s`, role))
		pgtest.Drop(db.Cluster, db.Name)
		if admin, err := pgx.Connect(ctx, db.Cluster.URL); err == nil {
			admin.Exec(ctx, fmt.Sprintf(`DROP ROLE IF EXISTS %s`, role))
			admin.Close(ctx)
		}
	})
	var super bool
	if err := db.Pool.QueryRow(ctx, `SELECT rolsuper FROM pg_roles WHERE rolname = $1`, role).Scan(&super); err != nil || super {
		t.Fatalf("role is superuser=%v (%v)", super, err)
	}
	url := strings.Replace(db.URL, "postgres@", role+":"+planted+"@", 1)
	p := relaytest.Start(t, nil, "--database-url", url, "--slot", db.Slot, "--publication", db.Publication,
		"--status-interval", "200ms", "--heartbeat-interval", "1s", "--log-level", "debug")
	var events []string
	for i := 0; i < 10; i++ {
		events = append(events, createBrief(t, db, fmt.Sprintf("least privilege %d", i), true).String())
	}
	waitFor(t, 60*time.Second, "10 completed sagas run by the unprivileged relay", func() bool {
		return count(t, db, `SELECT count(*) FROM saga_instances WHERE status = 'COMPLETED' AND trigger_event_id::text = ANY($1)`, events) == 10
	})
	p.Stop(30 * time.Second)
	if strings.Contains(p.Output(), planted) {
		t.Fatalf("the password appears in the relay's output")
	}
	if !strings.Contains(p.Output(), "relay started") {
		t.Fatalf("no start line in the output:\n%s", p.Output())
	}
}
