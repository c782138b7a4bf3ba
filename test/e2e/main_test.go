// Package e2e drives the real relay binary against a real PostgreSQL: what a
// user sees, through the public contracts (CLI, tables, HTTP).
package e2e

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

func TestMain(m *testing.M) {
	testkit.SkipSuiteInShort("end-to-end tests of the relay binary")
	code := pgtest.Main(m)
	relaytest.Cleanup()
	os.Exit(code)
}

// relayArgs are the flags that point a relay at db with test-friendly
// intervals.
func relayArgs(db *pgtest.DB, extra ...string) []string {
	return append([]string{
		"--database-url", db.URL, "--slot", db.Slot, "--publication", db.Publication,
		"--status-interval", "200ms", "--heartbeat-interval", "1s", "--workers", "4",
	}, extra...)
}

// createBrief commits a research brief and its research_brief.created outbox
// row in one application transaction, as a producer does.
func createBrief(t *testing.T, db *pgtest.DB, title string, commit bool) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	brief, tenant, event := uuid.New(), uuid.New(), uuid.New()
	if _, err := tx.Exec(ctx, `INSERT INTO research_briefs (id, tenant_id, title, body) VALUES ($1, $2, $3, 'A study of outbox relays and sagas.')`,
		brief, tenant, title); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Write(ctx, tx, outbox.Message{ID: event, TenantID: tenant, AggregateType: "research_brief",
		AggregateID: brief.String(), EventType: "research_brief.created",
		Payload: map[string]string{"brief_id": brief.String()}}); err != nil {
		t.Fatal(err)
	}
	if commit {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return event
}

func count(t *testing.T, db *pgtest.DB, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func instancesFor(t *testing.T, db *pgtest.DB, event uuid.UUID) int {
	return count(t, db, `SELECT count(*) FROM saga_instances WHERE trigger_event_id = $1`, event)
}

func nonEmptyLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return out
}

var _ = pgx.ErrNoRows
