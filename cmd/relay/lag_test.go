package main

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"sync"
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

// lockedBuffer is a bytes.Buffer a command writes while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestLagFollowSaysAnOutageOnce: while the database is down, relay lag -f
// prints the failure once, as one line (not pgx's multi-line dial error,
// not once per tick), and one line when it reads again.
func TestLagFollowSaysAnOutageOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := pgdocker.Start(ctx, pgcluster.Options{})
	if err != nil {
		t.Fatalf("start PostgreSQL: %v", err)
	}
	t.Cleanup(func() { c.Stop() })
	if c.Kind != pgcluster.KindLocal {
		t.Skip("halting the server needs a local cluster")
	}
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Apply(ctx, conn, migrations.Options{}); err != nil {
		t.Fatal(err)
	}
	if err := cdc.Setup(ctx, conn, cdc.Config{Slot: "lag_cli_slot", Publication: "lag_cli_pub"}); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)

	fctx, fcancel := context.WithCancel(ctx)
	defer fcancel()
	var stdout, stderr lockedBuffer
	done := make(chan error, 1)
	go func() {
		root := newRootCmd(&rootOptions{})
		root.SetOut(&stdout)
		root.SetErr(&stderr)
		root.SetArgs([]string{"lag", "--database-url", c.URL, "--slot", "lag_cli_slot", "-f", "--interval", "100ms"})
		done <- root.ExecuteContext(fctx)
	}()
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !ok(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: stdout:\n%s\nstderr:\n%s", what, stdout.String(), stderr.String())
			}
		}
	}
	waitFor("a first line", func() bool { return strings.Contains(stdout.String(), "lag_cli_slot") })
	if err := c.Halt(true); err != nil {
		t.Fatal(err)
	}
	waitFor("the outage said", func() bool { return stderr.String() != "" })
	time.Sleep(1500 * time.Millisecond) // 15 ticks with the server down
	down := stderr.String()
	if n := strings.Count(down, "\n"); n != 1 {
		t.Errorf("%d lines on stderr over 15 failed ticks, want 1:\n%s", n, down)
	}
	if !strings.HasPrefix(down, "relay lag: ") || strings.Contains(down, "\t") {
		t.Errorf("the outage line: %q", down)
	}
	if err := c.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor("reading again", func() bool { return strings.Contains(stderr.String(), "relay lag: reading again after ") })
	fcancel()
	if err := <-done; err != nil {
		t.Fatalf("lag -f: %v", err)
	}
	t.Logf("stderr:\n%s", stderr.String())
	if n := strings.Count(stderr.String(), "\n"); n != 2 {
		t.Errorf("stderr over the outage, want 2 lines:\n%s", stderr.String())
	}
}

func TestOutageNotesSayEachChangeOnce(t *testing.T) {
	t.Parallel()
	var w bytes.Buffer
	o := outageNotes{every: time.Second}
	t0 := time.Unix(1000, 0)
	o.ok(&w, t0)
	o.fail(&w, t0, connectionLost, "unexpected EOF")
	for i := 1; i < 5; i++ {
		o.fail(&w, t0.Add(time.Duration(i)*time.Second), connectionLost, "cannot reach PostgreSQL")
	}
	o.fail(&w, t0.Add(5*time.Second), "slot", `replication slot "s" does not exist`)
	o.ok(&w, t0.Add(7200*time.Millisecond))
	o.ok(&w, t0.Add(8*time.Second))
	want := "relay lag: unexpected EOF (trying again every 1s; said once until it changes)\n" +
		"relay lag: replication slot \"s\" does not exist (trying again every 1s; said once until it changes)\n" +
		"relay lag: reading again after 7s (6 failed attempt(s))\n"
	if w.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", w.String(), want)
	}
}
