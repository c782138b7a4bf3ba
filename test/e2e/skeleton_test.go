package e2e

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/internal/pgcluster"
	"github.com/compensa/compensa/internal/pgcluster/pgdocker"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

func TestCommittedTriggerStartsSagaRolledBackDoesNot(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	p := relaytest.Start(t, nil, relayArgs(db)...)
	committed := createBrief(t, db, "Committed brief", true)
	rolledBack := createBrief(t, db, "Rolled back brief", false)
	// The stream is in commit order: once a later commit is handled, the
	// rolled-back event would have been too.
	marker := createBrief(t, db, "Marker brief", true)
	testkit.WaitFor(t, 30*time.Second, "both committed briefs to start sagas", func() bool {
		return instancesFor(t, db, committed) == 1 && instancesFor(t, db, marker) == 1
	})
	if n := instancesFor(t, db, rolledBack); n != 0 {
		t.Fatalf("a rolled-back outbox row started %d sagas", n)
	}
	var name string
	var version int
	if err := db.Pool.QueryRow(context.Background(), `SELECT saga_name, saga_version FROM saga_instances WHERE trigger_event_id = $1`, committed).
		Scan(&name, &version); err != nil {
		t.Fatal(err)
	}
	if name != "brief_enrichment" || version != 1 {
		t.Fatalf("started %s v%d, want brief_enrichment v1", name, version)
	}
	p.Stop(30 * time.Second)
}

func TestEventsCommittedWhileStoppedAreHandledOnce(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	var events []uuid.UUID
	p := relaytest.Start(t, nil, relayArgs(db)...)
	for i := 0; i < 20; i++ {
		events = append(events, createBrief(t, db, fmt.Sprintf("before %d", i), true))
	}
	testkit.WaitFor(t, 30*time.Second, "the first 20 sagas", func() bool {
		return count(t, db, `SELECT count(*) FROM saga_instances`) == 20
	})
	p.Stop(30 * time.Second)
	for i := 0; i < 50; i++ {
		events = append(events, createBrief(t, db, fmt.Sprintf("while down %d", i), true))
	}
	p = relaytest.Start(t, nil, relayArgs(db)...)
	testkit.WaitFor(t, 30*time.Second, "all 70 sagas", func() bool {
		return count(t, db, `SELECT count(*) FROM saga_instances`) == len(events)
	})
	for _, e := range events {
		if n := instancesFor(t, db, e); n != 1 {
			t.Fatalf("event %s started %d sagas, want 1", e, n)
		}
	}
	p.Stop(30 * time.Second)
}

// slotFlushed reads the slot's confirmed_flush_lsn: what PostgreSQL was told.
func slotFlushed(t *testing.T, db *pgtest.DB) pglogrepl.LSN {
	t.Helper()
	var s string
	if err := db.Pool.QueryRow(context.Background(), `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, db.Slot).Scan(&s); err != nil {
		t.Fatal(err)
	}
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return lsn
}

func checkpointLSN(t *testing.T, db *pgtest.DB) pglogrepl.LSN {
	t.Helper()
	var s string
	err := db.Pool.QueryRow(context.Background(), `SELECT lsn::text FROM relay_checkpoints WHERE slot_name = $1`, db.Slot).Scan(&s)
	if err == pgx.ErrNoRows {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	lsn, _ := pglogrepl.ParseLSN(s)
	return lsn
}

// The limits below are generous: a relay built with -race on a busy
// two-core machine takes many seconds to start and run its first saga.
func TestKilledBetweenCommitAndAcknowledgementReplaysWithoutDoubling(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	// Warm up: the slot exists and has acknowledged everything so far.
	p := relaytest.Start(t, nil, relayArgs(db)...)
	warm := createBrief(t, db, "warm-up", true)
	testkit.WaitFor(t, 90*time.Second, "warm-up saga", func() bool { return instancesFor(t, db, warm) == 1 })
	// Let the warm-up saga finish and its emitted outbox rows be streamed and
	// acknowledged, so that the next batch with events is the crash victim's.
	testkit.WaitFor(t, 90*time.Second, "warm-up saga to complete", func() bool {
		return count(t, db, `SELECT count(*) FROM saga_instances WHERE trigger_event_id = $1 AND status = 'COMPLETED'`, warm) == 1
	})
	var walNow string
	if err := db.Pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&walNow); err != nil {
		t.Fatal(err)
	}
	target, _ := pglogrepl.ParseLSN(walNow)
	testkit.WaitFor(t, 90*time.Second, "the slot to acknowledge the warm-up", func() bool { return slotFlushed(t, db) >= target })
	p.Stop(30 * time.Second)

	// The failpoint SIGKILLs the relay right after the correlator commits
	// the first batch with events, before any status update can carry it.
	crashing := relaytest.Start(t, []string{"RELAY_FAILPOINT=crash-after-batch:1"},
		relayArgs(db, "--status-interval", "1h", "--log-level", "debug")...)
	event := createBrief(t, db, "crash victim", true)
	code, exited := crashing.Wait(90 * time.Second)
	if !exited {
		t.Fatalf("relay with the failpoint did not die\n%s", crashing.Output())
	}
	if ws, ok := crashing.ExitErr().(interface{ Sys() any }); ok {
		if st, ok := ws.Sys().(syscall.WaitStatus); ok && st.Signal() != syscall.SIGKILL {
			t.Fatalf("relay ended with %v (code %d), want SIGKILL", st, code)
		}
	}
	if n := instancesFor(t, db, event); n != 1 {
		t.Fatalf("the correlator's commit should have started the saga before the kill: %d instances\n%s", n, crashing.Output())
	}
	cp, flushed := checkpointLSN(t, db), slotFlushed(t, db)
	if cp <= flushed {
		t.Fatalf("checkpoint %s is not ahead of the slot's confirmed flush %s: the kill did not land between commit and acknowledgement", cp, flushed)
	}

	// Restart: the slot's position is behind the checkpoint; the relay
	// resumes at the checkpoint, so PostgreSQL skips the handled transaction
	// (whatever it still sent would be recognised as a replay).
	p = relaytest.Start(t, nil, relayArgs(db, "--log-level", "debug")...)
	after := createBrief(t, db, "after restart", true)
	testkit.WaitFor(t, 90*time.Second, "the post-restart saga", func() bool { return instancesFor(t, db, after) == 1 })
	if n := instancesFor(t, db, event); n != 1 {
		t.Fatalf("the replayed event has %d sagas, want 1", n)
	}
	if total := count(t, db, `SELECT count(*) FROM saga_instances`); total != 3 {
		t.Fatalf("instances = %d, want 3", total)
	}
	testkit.WaitFor(t, 60*time.Second, "the resume at the checkpoint to be logged", func() bool {
		return strings.Contains(p.Output(), "resuming at the checkpoint, past the slot's position")
	})
	testkit.WaitFor(t, 60*time.Second, "the slot to acknowledge past the checkpoint", func() bool {
		return slotFlushed(t, db) >= checkpointLSN(t, db)
	})
	p.Stop(30 * time.Second)
}

func TestMigrateTwiceIsANoOp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewEmptyDB(t).URL

	out, code := relaytest.Run(t, nil, "migrate", "--database-url", url, "--with-examples")
	if code != 0 || !strings.Contains(out, "applied core 0001") {
		t.Fatalf("first migrate: code %d\n%s", code, out)
	}
	schema := func() string {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var s string
		if err := conn.QueryRow(ctx, `SELECT string_agg(table_name || '.' || column_name || ':' || data_type || ':' || coalesce(column_default, ''), ',' ORDER BY table_name, column_name)
			FROM information_schema.columns WHERE table_schema = 'public'`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		var idx string
		conn.QueryRow(ctx, `SELECT string_agg(indexdef, ';' ORDER BY indexdef) FROM pg_indexes WHERE schemaname = 'public'`).Scan(&idx)
		return s + idx
	}
	before := schema()
	out, code = relaytest.Run(t, []string{"RELAY_DATABASE_URL=" + url}, "migrate", "--with-examples")
	if code != 0 || !strings.Contains(out, "schema is up to date") {
		t.Fatalf("second migrate: code %d\n%s", code, out)
	}
	if schema() != before {
		t.Fatal("the second migrate changed the schema")
	}
}

func TestBadInputExitsWithOneClearLineAndNoPassword(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	const planted = "Pl4nted-Secret_pw"

	// A role that may log in but lacks REPLICATION.
	if _, err := db.Pool.Exec(ctx, fmt.Sprintf(`CREATE ROLE norepl_%s LOGIN PASSWORD '%s'`, db.Name, planted)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		db.Pool.Exec(context.Background(), fmt.Sprintf(`DROP OWNED BY norepl_%s; DROP ROLE IF EXISTS norepl_%s`, db.Name, db.Name))
	})
	noReplURL := strings.Replace(db.URL, "postgres@", fmt.Sprintf("norepl_%s:%s@", db.Name, planted), 1)
	// It has every grant relay run needs, REPLICATION taken back.
	if out, code := relaytest.Run(t, nil, "migrate", "--grant-to", "norepl_"+db.Name, "--database-url", db.URL, "--publication", db.Publication); code != 0 {
		t.Fatalf("relay migrate --grant-to: %d\n%s", code, out)
	}
	if _, err := db.Pool.Exec(ctx, fmt.Sprintf(`ALTER ROLE norepl_%s NOREPLICATION`, db.Name)); err != nil {
		t.Fatal(err)
	}

	// A server without wal_level=logical.
	replica, err := pgdocker.Start(ctx, pgcluster.Options{Settings: map[string]string{"wal_level": "replica"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { replica.Stop() })
	walURL := strings.Replace(replica.URL, "postgres@", "postgres:"+planted+"@", 1)

	cases := []struct {
		name string
		url  string
		want []string
	}{
		{"unreachable", fmt.Sprintf("postgres://app:%s@127.0.0.1:1/nowhere?connect_timeout=3", planted), []string{"cannot reach PostgreSQL", "--database-url"}},
		{"wal_level", walURL, []string{"wal_level", "logical"}},
		{"no replication", noReplURL, []string{"REPLICATION"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, code := relaytest.Run(t, nil, "run", "--database-url", tc.url, "--slot", db.Slot, "--publication", db.Publication, "--http-addr", "127.0.0.1:0")
			if code == 0 {
				t.Fatalf("relay exited 0\n%s", out)
			}
			if strings.Contains(out, planted) {
				t.Fatalf("the password leaked:\n%s", out)
			}
			lines := nonEmptyLines(out)
			if len(lines) != 1 {
				t.Fatalf("want one line, got %d:\n%s", len(lines), out)
			}
			for _, w := range tc.want {
				if !strings.Contains(lines[0], w) {
					t.Errorf("message %q does not mention %q", lines[0], w)
				}
			}
		})
	}
}
