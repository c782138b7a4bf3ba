//go:build chaos

package chaos

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/compensa/compensa/internal/briefs"
	"github.com/compensa/compensa/internal/pgcluster"
)

// scenarioDBFaults: a durable cluster of its own (fsync and synchronous
// commit on, so that an immediate restart is a real crash recovery), one
// relay and the producer. Faults in random order: PostgreSQL restarted with
// -m immediate (SIGQUIT: no shutdown checkpoint, crash recovery on start),
// and the walsender terminated (pg_terminate_backend on
// pg_stat_replication's pid). The relay must ride through every one without
// exiting; the time to resume is measured from the fault to the first saga
// started from a trigger committed after it. The bound applies to the
// relay's share of it: for a restart, the time after the server accepts
// connections again (crash recovery with fsync on takes what the disk
// gives it, which on a machine busy with other suites can be seconds).
func scenarioDBFaults(t *testing.T, r *report) {
	restarts, terminations := pick(10, 2), pick(20, 4)
	rnd := rng("dbfaults")
	tg := ownCluster(t, pgcluster.Options{Durable: true})
	installAudit(t, tg)
	visibilityProbe(t, r, tg)
	p := startRelay(t, nil, relayArgs(tg, "chaos-db")...)
	prod := startProducer(tg.Pool, pick(30.0, 20.0), pick(170.0, 80.0), 10, 2)
	stopped := false
	defer func() {
		if !stopped {
			prod.stop()
		}
	}()
	time.Sleep(2 * time.Second)

	faults := make([]string, 0, restarts+terminations)
	for range restarts {
		faults = append(faults, "restart")
	}
	for range terminations {
		faults = append(faults, "walsender")
	}
	rnd.Shuffle(len(faults), func(i, j int) { faults[i], faults[j] = faults[j], faults[i] })

	resume := map[string]durations{}
	var all, relayShare durations
	notResumed, relayExits, noWalsender := 0, 0, 0
	var down durations
	ctx := context.Background()
	for _, f := range faults {
		time.Sleep(between(rnd, pick(2*time.Second, time.Second), pick(4*time.Second, 2*time.Second)))
		var fault time.Time
		var serverDown time.Duration
		switch f {
		case "restart":
			fault = time.Now()
			rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			err := tg.Cluster.Restart(rctx, true)
			cancel()
			if err != nil {
				t.Fatalf("restart -m immediate: %v", err)
			}
			serverDown = time.Since(fault)
			down = append(down, serverDown)
		case "walsender":
			// The relay may be between connections: wait for its walsender.
			var killed bool
			waitUntil(10*time.Second, func() bool {
				fault = time.Now()
				err := tg.Pool.QueryRow(ctx, `SELECT coalesce(bool_or(pg_terminate_backend(pid)), false) FROM pg_stat_replication`).Scan(&killed)
				return err == nil && killed
			})
			if !killed {
				noWalsender++
				continue
			}
		}
		d, ok := resumeAfter(tg, "outbox", fault, 60*time.Second, p.Done())
		if !ok {
			notResumed++
		} else {
			resume[f] = append(resume[f], d)
			all = append(all, d)
			relayShare = append(relayShare, max(d-serverDown, 0))
		}
		select {
		case <-p.Done():
			relayExits++
			r.figure("relay exited", "after a %s fault: %s", f, p.Exit())
			p = startRelay(t, nil, relayArgs(tg, "chaos-db")...)
		default:
		}
	}
	prod.stop()
	stopped = true
	drain, ok := waitDrained(t, tg, pick(5*time.Minute, 2*time.Minute))
	r.expect(ok, "drained: every trigger started, every saga terminal", "after %s", drain.Round(time.Second))
	exit, clean := p.Stop(60 * time.Second)
	r.expect(clean, "the relay stops gracefully at the end", "%s", exit)
	logs := p.Output()

	r.figure("faults", "%d restarts -m immediate (server down %s), %d walsenders terminated", restarts, down, terminations)
	r.figure("producer", "%s", prod.summary())
	r.figure("time to resume, restart", "%s", resume["restart"])
	r.figure("time to resume, walsender", "%s", resume["walsender"])
	r.figure("time to resume, all faults", "%s", all)
	r.figure("time to resume once the server is back", "%s", relayShare)
	r.figure("relay reconnects logged", "%d", strings.Count(logs, "reconnect"))
	v := account(t, tg, prod)
	v.report(r)
	ef := checkEffects(t, tg)
	ef.report(r)
	r.expect(relayExits == 0, "the relay never exited on a database fault", "%d exits", relayExits)
	r.expect(notResumed == 0, "work resumed after every fault (within 60 s)", "%d faults without", notResumed)
	r.expect(noWalsender == 0, "a walsender to terminate each time", "%d times none within 10 s", noWalsender)
	r.expect(len(relayShare) > 0 && relayShare.pct(99) < 10*time.Second, "time to resume once the server is back p99 < 10 s", "%s (from the fault: %s)",
		relayShare.pct(99).Round(10*time.Millisecond), all.pct(99).Round(10*time.Millisecond))
	r.expect(!strings.Contains(logs, "panic:"), "no panic in the relay's output", "%d", strings.Count(logs, "panic:"))
	r.head = fmt.Sprintf("%d restarts + %d walsender kills: %d lost, %d duplicated; resume p99 %s (%s once the server is back)", restarts, terminations,
		v.lost, v.duplicated, all.pct(99).Round(10*time.Millisecond), relayShare.pct(99).Round(10*time.Millisecond))
	r.keepLog("relay", logs)
}

// visibilityProbe shows whether a saga's first step can run before its
// trigger's transaction is visible. PostgreSQL sends a transaction to a
// logical replication client once its commit record is flushed, but other
// sessions see it only after the committing backend leaves the proc array,
// and with synchronous replication only after the standby confirms. The probe
// makes that gap long: synchronous_standby_names names a standby that never
// connects, so the producer's COMMIT waits (its transaction flushed, decoded,
// invisible) while the relay's own sessions commit with
// synchronous_commit=local. The saga starts and its first step runs while
// the brief is invisible; it must not fail for good on that: once the
// standby requirement is lifted, the brief commits and the saga must
// complete.
func visibilityProbe(t *testing.T, r *report, tg *target) {
	ctx := context.Background()
	url := withApp(tg.URL, "chaos-visibility") + "&options=-c%20synchronous_commit%3Dlocal"
	p := startRelay(t, nil, append(relayArgs(tg, "chaos-visibility"), "--database-url", url)...)
	defer p.Stop(60 * time.Second)
	time.Sleep(2 * time.Second) // the slot exists and streams
	for _, q := range []string{`ALTER SYSTEM SET synchronous_standby_names = 'chaos_ghost'`, `SELECT pg_reload_conf()`} {
		if _, err := tg.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	lift := func() {
		tg.Pool.Exec(context.Background(), `ALTER SYSTEM RESET synchronous_standby_names`)
		tg.Pool.Exec(context.Background(), `SELECT pg_reload_conf()`)
	}
	defer lift()
	time.Sleep(500 * time.Millisecond)
	committed := make(chan error, 1)
	briefCh := make(chan string, 1)
	go func() {
		tx, err := tg.Pool.Begin(ctx)
		if err != nil {
			committed <- err
			return
		}
		defer tx.Rollback(ctx)
		id, err := briefs.Create(ctx, tx, tenants[0], "Visibility probe: rooftop solar for a school", "Which inverters suit a school roof?")
		if err != nil {
			committed <- err
			return
		}
		briefCh <- id.String()
		committed <- tx.Commit(ctx)
	}()
	brief := <-briefCh
	var status, lastError string
	started := waitUntil(20*time.Second, func() bool {
		return tg.Pool.QueryRow(ctx, `SELECT status::text, coalesce(last_error, '') FROM saga_instances WHERE context->>'brief_id' = $1`,
			brief).Scan(&status, &lastError) == nil
	})
	acted := started && waitUntil(10*time.Second, func() bool {
		n, err := count(ctx, tg.Pool, `SELECT count(*) FROM saga_events e JOIN saga_instances i ON i.id = e.instance_id
			WHERE i.context->>'brief_id' = $1`, brief)
		return err == nil && n > 0
	})
	var firstEvent string
	tg.Pool.QueryRow(ctx, `SELECT e.kind || coalesce(': ' || (e.payload->>'error'), '') FROM saga_events e JOIN saga_instances i ON i.id = e.instance_id
		WHERE i.context->>'brief_id' = $1 ORDER BY e.version LIMIT 1`, brief).Scan(&firstEvent)
	lift()
	if err := <-committed; err != nil {
		t.Fatalf("visibility probe: the producer's commit: %v", err)
	}
	waitUntil(60*time.Second, func() bool {
		return tg.Pool.QueryRow(ctx, `SELECT status::text, coalesce(last_error, '') FROM saga_instances WHERE context->>'brief_id' = $1`,
			brief).Scan(&status, &lastError) == nil && status != "RUNNING" && status != "COMPENSATING"
	})
	var briefStatus string
	tg.Pool.QueryRow(ctx, `SELECT status::text FROM research_briefs WHERE id = $1`, brief).Scan(&briefStatus)
	r.figure("visibility probe", "saga started while its trigger's COMMIT waited: %t; first journal entry then: %q; in the end saga %s, brief %s",
		started, clipText(firstEvent, 140), status, briefStatus)
	if acted && status != "COMPLETED" {
		r.figure("visibility probe", "last error: %s", clipText(lastError, 200))
	}
	r.expect(status == "COMPLETED" && briefStatus == "ENRICHED", "a saga started before its trigger is visible still completes",
		"saga %s, brief %s", status, briefStatus)
}
