//go:build chaos

package chaos

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/compensa/compensa/test/pgtest"
)

// scenarioKill: one relay (stream, correlator, runner) is SIGKILLed at
// random moments while the producer commits; one kill in five is instead the
// RELAY_FAILPOINT crash right after the correlator's N-th commit, before the
// stream can acknowledge it (the replay the checkpoint exists for). After
// each kill a new relay starts at once. At the end the producer stops, the
// last relay drains everything and stops gracefully, and the checker
// accounts for every trigger and every step effect.
func scenarioKill(t *testing.T, r *report) {
	kills := pick(50, 8)
	triggerRate, noiseRate := pick(50.0, 20.0), pick(950.0, 180.0)
	rnd := rng("kill")
	db := pgtest.NewDB(t)
	tg := fromPgtest(db)
	installAudit(t, tg)

	gen := 0
	var logs strings.Builder
	// start launches the next relay; with failAfter it carries the failpoint
	// and may die before it ever answers /healthz.
	start := func(failAfter int) *child {
		gen++
		var env []string
		if failAfter > 0 {
			env = []string{fmt.Sprintf("RELAY_FAILPOINT=crash-after-batch:%d", failAfter)}
		}
		c := startChild(t, env, relayArgs(tg, fmt.Sprintf("chaos-kill-g%d", gen))...)
		if failAfter == 0 && !c.healthy(60*time.Second) {
			t.Fatalf("relay generation %d did not become healthy: %s\n%s", gen, c.Exit(), c.Output())
		}
		return c
	}
	p, failing := start(0), false
	prod := startProducer(tg.Pool, triggerRate, noiseRate, 10, 2)
	stopped := false
	defer func() {
		if !stopped {
			prod.stop()
		}
	}()

	var resume durations
	var replayed, dupStarts float64
	unmeasured := 0
	// scrape adds a relay's replay counters just before it is killed.
	scrape := func(p *child) {
		n, _ := metric(p.Addr, "compensa_batches_replayed_total")
		d, _ := metric(p.Addr, "compensa_duplicate_starts_total")
		replayed += n
		dupStarts += d
	}
	failpoints, failpointMissed, startFailures := 0, 0, 0
	var uptimes durations
	for i := range kills {
		born := time.Now()
		var fault time.Time
		if failing {
			// The failpoint kills the process after its N-th commit.
			if !p.Wait(60 * time.Second) {
				failpointMissed++
				p.Kill()
			}
			fault = time.Now()
			failpoints++
		} else {
			time.Sleep(between(rnd, 300*time.Millisecond, 3*time.Second))
			scrape(p)
			fault = time.Now()
			p.Kill()
		}
		uptimes = append(uptimes, fault.Sub(born))
		logs.WriteString(fmt.Sprintf("--- generation %d (%s)\n%s", gen, p.Exit(), p.Output()))
		failAfter := 0
		if i < kills-1 && rnd.IntN(5) == 0 {
			failAfter = 1 + rnd.IntN(30)
		}
		p, failing = start(failAfter), failAfter > 0
		d, ok := resumeAfter(tg, "outbox", fault, 60*time.Second, p.Done())
		switch {
		case ok:
			resume = append(resume, d)
		case failing && isDone(p):
			unmeasured++ // its failpoint struck before a trigger came through
		default:
			startFailures++
		}
	}
	prod.stop()
	stopped = true
	drain, ok := waitDrained(t, tg, pick(10*time.Minute, 3*time.Minute))
	r.expect(ok, "drained: every trigger started, every saga terminal", "after %s", drain.Round(time.Second))
	scrape(p)
	exit, clean := p.Stop(60 * time.Second)
	r.expect(clean, "the last relay stops gracefully", "%s", exit)
	logs.WriteString(fmt.Sprintf("--- generation %d (graceful stop: %s)\n%s", gen, exit, p.Output()))

	r.figure("kills", "%d (%d by the failpoint right after a correlator commit), relay uptime between kills %s", kills, failpoints, uptimes)
	r.figure("producer", "%s", prod.summary())
	r.figure("time to resume after a kill", "%s (fault → first saga started from a trigger committed after it, restart included)", resume)
	r.figure("drain after the producer stopped", "%s", drain.Round(100*time.Millisecond))
	r.figure("replays recognised", "%.0f batches skipped by the checkpoint, %.0f starts absorbed by the unique index (relays killed by SIGKILL and the last one; failpoint victims cannot be scraped)", replayed, dupStarts)
	if unmeasured > 0 {
		r.figure("resume not measured", "%d times: the next relay's failpoint struck before a trigger came through", unmeasured)
	}
	v := account(t, tg, prod)
	v.report(r)
	ef := checkEffects(t, tg)
	ef.report(r)
	stale, ex := staleWrites(t, tg)
	for _, e := range ex {
		r.figure("example", "%s", e)
	}
	r.expect(stale == 0, "0 journal writes from a stale lease", "%d", stale)
	r.expect(failpointMissed == 0, "every failpoint relay crashed by itself", "%d did not", failpointMissed)
	r.expect(startFailures == 0, "work resumed after every kill (within 60 s)", "%d kills without", startFailures)
	r.expect(!strings.Contains(logs.String(), "panic:"), "no panic in any relay's output", "%d", strings.Count(logs.String(), "panic:"))
	r.head = fmt.Sprintf("%d kills, %d triggers: %d lost, %d duplicated; resume p99 %s", kills, v.triggers, v.lost, v.duplicated,
		resume.pct(99).Round(10*time.Millisecond))
	r.keepLog("relays", logs.String())
}

func isDone(p *child) bool {
	select {
	case <-p.Done():
		return true
	default:
		return false
	}
}
