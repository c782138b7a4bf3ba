package main

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/internal/pgcluster"
	"github.com/compensa/compensa/internal/pgcluster/pgdocker"
	"github.com/compensa/compensa/migrations"
)

// runLag runs `relay lag <args>` in process until it returns or ctx ends.
func runLag(ctx context.Context, url string, args ...string) (stdout, stderr string, err error) {
	root := newRootCmd(&rootOptions{})
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(append([]string{"lag", "--database-url", url, "--slot", "lag_cli_slot"}, args...))
	err = root.ExecuteContext(ctx)
	return out.String(), errOut.String(), err
}

// TestLagCLI checks `relay lag` as an SRE runs it: a human line, JSON with
// the documented keys, --follow, and a missing slot.
func TestLagCLI(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := pgdocker.Start(ctx, pgcluster.Options{})
	if err != nil {
		t.Fatalf("start PostgreSQL: %v", err)
	}
	t.Cleanup(func() { c.Stop() })
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := migrations.Apply(ctx, conn, migrations.Options{}); err != nil {
		t.Fatal(err)
	}

	if _, _, err := runLag(ctx, c.URL); err == nil || !strings.Contains(err.Error(), "lag_cli_slot") {
		t.Fatalf("lag of a missing slot: %v, want an error naming it", err)
	}
	if err := cdc.Setup(ctx, conn, cdc.Config{Slot: "lag_cli_slot", Publication: "lag_cli_pub"}); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE filler AS SELECT g FROM generate_series(1, 10000) g`); err != nil {
		t.Fatal(err)
	}
	// The test cluster commits asynchronously: wait until the WAL writer has
	// written the filler, so that the slot is behind the server's position.
	for deadline := time.Now().Add(10 * time.Second); ; {
		var behind bool
		if err := conn.QueryRow(ctx, `SELECT pg_current_wal_lsn() > confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'lag_cli_slot'`).Scan(&behind); err != nil {
			t.Fatal(err)
		}
		if behind {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the server's WAL position never passed the slot's")
		}
		time.Sleep(50 * time.Millisecond)
	}

	out, _, err := runLag(ctx, c.URL)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"slot lag_cli_slot", "active=false", "wal_status=reserved", " bytes)", "lag_seconds=unknown", "confirmed_flush_lsn=", "current_lsn="} {
		if !strings.Contains(out, want) {
			t.Errorf("human output %q lacks %q", out, want)
		}
	}

	out, _, err = runLag(ctx, c.URL, "--json")
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := json.Unmarshal([]byte(out), &obj); err != nil || strings.Count(out, "\n") != 1 {
		t.Fatalf("--json output %q: %v", out, err)
	}
	want := []string{"active", "confirmed_flush_lsn", "current_lsn", "failover", "failover_ready", "lag_bytes", "lag_seconds", "slot", "synchronized_standby_slots", "wal_status"}
	if got := slices.Sorted(maps.Keys(obj)); !slices.Equal(got, want) {
		t.Fatalf("JSON keys %v, want %v", got, want)
	}
	if obj["lag_bytes"].(float64) <= 0 || obj["slot"] != "lag_cli_slot" || obj["lag_seconds"] != nil {
		t.Fatalf("JSON %v", obj)
	}

	fctx, fcancel := context.WithTimeout(ctx, 1200*time.Millisecond)
	defer fcancel()
	out, _, err = runLag(fctx, c.URL, "--json", "--follow", "--interval", "200ms")
	if err != nil {
		t.Fatalf("--follow: %v", err)
	}
	if n := strings.Count(out, "\n"); n < 3 {
		t.Fatalf("--follow printed %d lines in 1.2s at 200ms intervals:\n%s", n, out)
	}
}
