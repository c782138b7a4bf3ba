//go:build chaos

package chaos

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/internal/pgcluster"
)

// scenarioSlot: the slot is lost under a running relay, twice, on a cluster
// of its own (max_slot_wal_keep_size is cluster-wide):
//
//   - dropped: the walsender terminated and pg_drop_replication_slot, in a
//     loop until the drop wins the race with the relay's reconnect;
//   - invalidated: the relay SIGSTOPped, max_slot_wal_keep_size lowered
//     (ALTER SYSTEM, pg_reload_conf), then pg_switch_wal and CHECKPOINT
//     until wal_status = 'lost'; then SIGCONT.
//
// Each time the relay must exit non-zero with a message that names the slot,
// and never re-create it: the slot stays absent (or lost) after the exit, and
// after a second `relay run` that refuses to start.
func scenarioSlot(t *testing.T, r *report) {
	tg := ownCluster(t, pgcluster.Options{})
	installAudit(t, tg)
	ctx := context.Background()
	slotState := func() string {
		var st *string
		err := tg.Pool.QueryRow(ctx, `SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1`, tg.Slot).Scan(&st)
		if err == pgx.ErrNoRows {
			return "absent"
		}
		if err != nil {
			return "error: " + err.Error()
		}
		return *st
	}
	expectExit := func(kind string, p *child, fault time.Time, wantState string) {
		exited := p.Wait(90 * time.Second)
		code := p.Code()
		detect := time.Since(fault)
		out := p.Output()
		lastErr := lastLine(out, "relay: ")
		r.figure(kind+": exit", "code %d after %s; %q", code, detect.Round(100*time.Millisecond), clipText(lastErr, 200))
		r.expect(exited && code != 0, kind+": the relay exits non-zero", "exited %t, code %d", exited, code)
		r.expect(strings.Contains(lastErr, tg.Slot), kind+": its message names the slot", "%q", clipText(lastErr, 120))
		time.Sleep(3 * time.Second)
		st := slotState()
		r.expect(st == wantState, kind+": the slot is not re-created after the exit", "slot %s", st)
		again, code2 := runRelay(t, append([]string{"run", "--http-addr", "127.0.0.1:0"}, relayArgs(tg, "chaos-slot-again")...)...)
		st = slotState()
		r.figure(kind+": second start", "code %d: %q", code2, clipText(strings.TrimSpace(lastLine(again, "")), 200))
		r.expect(code2 != 0 && st == wantState, kind+": a second `relay run` refuses and leaves the slot "+wantState, "code %d, slot %s", code2, st)
		r.keepLog(kind, out+"\n--- second start\n"+again)
	}

	// Dropped.
	p := startRelay(t, nil, relayArgs(tg, "chaos-slot")...)
	prod := startProducer(tg.Pool, 10, 40, 0, 1)
	waitUntil(30*time.Second, func() bool { n, _ := count(ctx, tg.Pool, `SELECT count(*) FROM saga_instances`); return n >= 20 })
	var dropped bool
	tries := 0
	fault := time.Now()
	for !dropped && tries < 200 {
		tries++
		tg.Pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, tg.Slot)
		_, err := tg.Pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, tg.Slot)
		dropped = err == nil
		if !dropped {
			time.Sleep(10 * time.Millisecond)
		}
	}
	r.expect(dropped, "dropped: the slot could be dropped", "after %d tries", tries)
	r.figure("dropped: attempts to drop", "%d (terminate the walsender, then drop, until the drop wins)", tries)
	expectExit("dropped", p, fault, "absent")
	prod.stop()

	// Invalidated: a fresh slot, checkpoint and publication of its own.
	tg.Slot, tg.Publication = "chaos_slot_2", "chaos_pub_2"
	tg.Pool.Exec(ctx, `DELETE FROM relay_checkpoints`)
	p = startRelay(t, nil, relayArgs(tg, "chaos-slot-2")...)
	prod = startProducer(tg.Pool, 10, 40, 0, 1)
	before, _ := count(ctx, tg.Pool, `SELECT count(*) FROM saga_instances`)
	waitUntil(30*time.Second, func() bool {
		n, _ := count(ctx, tg.Pool, `SELECT count(*) FROM saga_instances`)
		return n >= before+20
	})
	prod.stop()
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Signal(syscall.SIGCONT) })
	for _, q := range []string{`ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'`, `SELECT pg_reload_conf()`, `CREATE TABLE chaos_filler (pad text)`} {
		if _, err := tg.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		tg.Pool.Exec(context.Background(), `ALTER SYSTEM RESET max_slot_wal_keep_size`)
		tg.Pool.Exec(context.Background(), `SELECT pg_reload_conf()`)
	})
	rounds := 0
	lost := waitUntil(2*time.Minute, func() bool {
		rounds++
		tg.Pool.Exec(ctx, `INSERT INTO chaos_filler SELECT repeat('x', 1000) FROM generate_series(1, 2000)`)
		tg.Pool.Exec(ctx, `SELECT pg_switch_wal()`)
		tg.Pool.Exec(ctx, `CHECKPOINT`)
		return slotState() == "lost"
	})
	r.expect(lost, "invalidated: wal_status reached 'lost'", "%s after %d rounds", slotState(), rounds)
	r.figure("invalidated: WAL rounds", "%d rounds of 2 MB, pg_switch_wal and CHECKPOINT until wal_status = 'lost'", rounds)
	fault = time.Now()
	p.Signal(syscall.SIGCONT)
	expectExit("invalidated", p, fault, "lost")
	r.head = fmt.Sprintf("dropped and invalidated: relay exits non-zero naming %s; slot never re-created", tg.Slot)
}

// lastLine returns the last line of out that contains want ("" = any).
func lastLine(out, want string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], want) {
			return lines[i]
		}
	}
	return ""
}

func clipText(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
