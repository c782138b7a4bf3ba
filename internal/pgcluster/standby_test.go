package pgcluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/test/testkit"
)

// TestFailoverSlotSurvivesPromotion starts PostgreSQL 17 and 18 (installed by the
// harness when missing), a hot standby with slot synchronization, creates a
// failover logical slot on the primary, kills the primary with SIGKILL and
// promotes the standby: the slot is there on the new primary.
func TestFailoverSlotSurvivesPromotion(t *testing.T) {
	testkit.SkipShort(t, "needs PostgreSQL 17 from npm")
	for _, v := range InstallableVersions() {
		t.Run(fmt.Sprintf("pg%d", v), func(t *testing.T) {
			t.Parallel()
			testFailoverSlotSurvivesPromotion(t, v)
		})
	}
}

func testFailoverSlotSurvivesPromotion(t *testing.T, version int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	primary, err := Start(ctx, Options{Version: version, Log: func(l string) { t.Log(l) }})
	if err != nil {
		t.Fatal(err)
	}
	defer primary.Stop()
	if v, err := primary.Major(ctx); err != nil || v != version {
		t.Fatalf("major = %d, %v; want %d", v, err, version)
	}
	standby, err := primary.StartStandby(ctx, StandbyOptions{Slot: "standby1"})
	if err != nil {
		t.Fatal(err)
	}
	defer standby.Stop()
	if r, err := standby.InRecovery(ctx); err != nil || !r {
		t.Fatalf("standby in recovery = %v, %v", r, err)
	}
	p, err := pgx.Connect(ctx, primary.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	if _, err := p.Exec(ctx, "SELECT pg_create_logical_replication_slot('fo', 'pgoutput', false, false, true)"); err != nil {
		t.Fatal(err)
	}
	// The cluster runs with synchronous_commit off: commit this transaction
	// with a flush, or its WAL may still sit in the primary's buffers when
	// the primary is killed below, and the table would never reach the standby.
	if _, err := p.Exec(ctx, "SET synchronous_commit = on; CREATE TABLE t (id int); INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	s, err := pgx.Connect(ctx, standby.URL)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		var n int
		if err := s.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'fo' AND synced AND NOT temporary").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		// A slot is synchronized for good once its consumer has moved it past
		// the standby's own position; nobody reads this one, so move it.
		if _, err := p.Exec(ctx, "SELECT pg_replication_slot_advance('fo', pg_current_wal_lsn())"); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the failover slot was not synchronized to the standby within 90 s")
		}
		time.Sleep(500 * time.Millisecond)
	}
	// The slot may be synchronized before the standby has replayed the
	// table: wait for the primary's WAL up to now (inserted, not only
	// written), so that the write after the promotion tests the promotion
	// and not the replication's delay.
	var written string
	if err := p.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&written); err != nil {
		t.Fatal(err)
	}
	for {
		var replayed bool
		if err := s.QueryRow(ctx, "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", written).Scan(&replayed); err != nil {
			t.Fatal(err)
		}
		if replayed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the standby did not replay the primary's WAL up to %s within 90 s", written)
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.Close(ctx)
	primary.Kill()
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, MultiHostURL("postgres", primary, standby))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'fo' AND failover").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatal("the failover slot is missing on the promoted standby")
	}
	if _, err := conn.Exec(ctx, "INSERT INTO t VALUES (2)"); err != nil {
		t.Fatalf("the promoted standby does not take writes: %v", err)
	}
}
