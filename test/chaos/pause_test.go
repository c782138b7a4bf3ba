//go:build chaos

package chaos

import (
	"fmt"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/compensa/compensa/test/pgtest"
)

// scenarioPause: two relays share the work with a one-second lease: A
// streams and runs workers, B runs workers only (--no-stream). One of them
// is SIGSTOPped for longer than the lease, mid-step more often than not
// (each has four workers busy with short steps), so that the other claims
// its instances; then SIGCONTed. A resumed worker must not commit: its
// journal write is fenced by the lease and rolled back with the step's
// effects. The audit counts any write accepted from another process's
// lease; the relays' metrics and logs count the rejections.
func scenarioPause(t *testing.T, r *report) {
	pauses := pick(50, 10)
	lease := time.Second
	rnd := rng("pause")
	db := pgtest.NewDB(t)
	tg := fromPgtest(db)
	installAudit(t, tg)
	leaseFlag := []string{"--lease", lease.String()}
	a := startRelay(t, nil, relayArgs(tg, "chaos-pause-a", leaseFlag...)...)
	b := startRelay(t, nil, relayArgs(tg, "chaos-pause-b", append(leaseFlag, "--no-stream")...)...)
	prod := startProducer(tg.Pool, pick(40.0, 25.0), 0, 5, 1)
	stopped := false
	defer func() {
		if !stopped {
			prod.stop()
		}
	}()
	time.Sleep(2 * time.Second)

	var paused durations
	perVictim := map[string]int{}
	// lost sums the lease_lost attempts both relays counted so far.
	lost := func() float64 {
		var n float64
		for _, p := range []*child{a, b} {
			v, _ := metric(p.Addr, "compensa_step_duration_seconds_count", `outcome="lease_lost"`)
			n += v
		}
		return n
	}
	caught := 0
	last := lost()
	for i := range pauses {
		victim, name := b, "B (--no-stream)"
		if i%2 == 1 {
			victim, name = a, "A (stream + workers)"
		}
		d := lease + between(rnd, 300*time.Millisecond, 1500*time.Millisecond)
		if err := victim.Signal(syscall.SIGSTOP); err != nil {
			t.Fatalf("SIGSTOP: %v", err)
		}
		time.Sleep(d)
		if err := victim.Signal(syscall.SIGCONT); err != nil {
			t.Fatalf("SIGCONT: %v", err)
		}
		paused = append(paused, d)
		perVictim[name]++
		time.Sleep(between(rnd, 300*time.Millisecond, 1200*time.Millisecond))
		if now := lost(); now > last {
			caught++
			last = now
		}
	}
	prod.stop()
	stopped = true
	drain, ok := waitDrained(t, tg, pick(5*time.Minute, 2*time.Minute))
	r.expect(ok, "drained: every trigger started, every saga terminal", "after %s", drain.Round(time.Second))

	// Rejections, from each relay's metrics (lease_lost outcomes of steps and
	// compensations) and from their logs.
	var rejected float64
	for _, p := range []*child{a, b} {
		n, err := metric(p.Addr, "compensa_step_duration_seconds_count", `outcome="lease_lost"`)
		if err != nil {
			t.Errorf("scrape %s/metrics: %v", p.Addr, err)
		}
		rejected += n
	}
	for name, p := range map[string]*child{"A": a, "B": b} {
		exit, clean := p.Stop(60 * time.Second)
		r.expect(clean, "relay "+name+" stops gracefully", "%s", exit)
	}
	logs := a.Output() + b.Output()
	logged := strings.Count(logs, "saga step rolled back: lease lost") + strings.Count(logs, "saga lease lost")

	r.figure("pauses", "%d (%s), each %s", pauses, victims(perVictim), paused)
	r.figure("lease", "%s (heartbeat every third)", lease)
	r.figure("producer", "%s", prod.summary())
	r.figure("stale attempts rejected", "%.0f step or compensation attempts ended lease_lost (metrics), %d lease-lost log lines; %d of %d pauses caught a step in flight",
		rejected, logged, caught, pauses)
	stale, ex := staleWrites(t, tg)
	for _, e := range ex {
		r.figure("example", "%s", e)
	}
	v := account(t, tg, prod)
	v.report(r)
	ef := checkEffects(t, tg)
	ef.report(r)
	comp, bad, cex := compensationOrder(t, tg)
	for _, e := range cex {
		r.figure("example", "%s", e)
	}
	r.figure("compensated instances checked", "%d", comp)
	r.expect(stale == 0, "0 journal writes accepted from a stale lease", "%d", stale)
	// The quick run makes too few pauses to be sure one lands mid-step: it
	// reports the count, the full run requires it.
	r.expect(rejected > 0 || quick, "more than 0 stale attempts rejected (the race happened; required in the full run)", "%.0f", rejected)
	r.expect(comp > 0 && bad == 0, "compensation always in reverse order, every completed step undone", "%d of %d off", bad, comp)
	r.expect(!strings.Contains(logs, "panic:"), "no panic in either relay's output", "%d", strings.Count(logs, "panic:"))
	r.head = fmt.Sprintf("%d pauses: %d stale writes accepted, %.0f rejected; %d compensations in order", pauses, stale, rejected, comp-bad)
	r.keepLog("relays", "--- A\n"+a.Output()+"--- B\n"+b.Output())
}

func victims(m map[string]int) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%d × %s", v, k))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}
