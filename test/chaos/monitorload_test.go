//go:build chaos

package chaos

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/compensa/compensa/test/pgtest"
)

// scenarioMonitorLoad: monitoring must never starve the work. A relay runs
// a steady saga load twice: alone, then while 100 clients without a token
// scrape /metrics and list instances through /v1 as fast as the monitor
// answers them. Before the fix, each scrape ran two counting queries on the
// workers' pool: 48 parallel scrapes made a saga take 6 s instead of 0.1 s.
// Now counted gauges come from memory, the monitor has a pool of its own
// and both endpoints bound their concurrency, so the sagas' end-to-end
// latency (trigger committed → instance COMPLETED, on the database's
// clock) must stay within twice the unloaded figure. Scrapes are paced (10
// a second by default): a client in a loop waits for its turn, or for its
// refusal, instead of spinning the relay's CPU.
func scenarioMonitorLoad(t *testing.T, r *report) {
	phase := pick(30*time.Second, 10*time.Second)
	rate := pick(10.0, 8.0)
	clients := 100
	db := pgtest.NewDB(t)
	tg := fromPgtest(db)
	relay := startRelay(t, nil, relayArgs(tg, "chaos-monitor")...)

	// run produces briefs for one phase and returns the end-to-end
	// latencies of the sagas they started.
	run := func(name string) durations {
		from := dbNow(t, tg)
		prod := startProducer(tg.Pool, rate, 0, 0, 1)
		time.Sleep(phase)
		prod.stop()
		to := dbNow(t, tg)
		if _, ok := waitDrained(t, tg, 2*time.Minute); !ok {
			t.Fatalf("%s: the sagas did not finish within 2 minutes", name)
		}
		return sagaLatencies(t, tg, from, to)
	}

	time.Sleep(2 * time.Second) // the relay's first heartbeat and checkpoint
	unloaded := run("unloaded")

	// The flood: half scrape, half list (a quarter of those the stuck
	// ones, the page's costliest query).
	var (
		stop              atomic.Bool
		wg                sync.WaitGroup
		mu                sync.Mutex
		codes             = map[string]map[int]int{}
		reqLatency        = map[string]durations{}
		transportErrs     atomic.Int64
		firstTransportErr atomic.Pointer[string]
	)
	paths := []string{"/metrics", "/v1/sagas?limit=100", "/metrics", "/v1/sagas?stuck=true&limit=100"}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	for i := range clients {
		path := paths[i%len(paths)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				began := time.Now()
				res, err := hc.Get("http://" + relay.Addr + path)
				if err != nil {
					transportErrs.Add(1)
					s := err.Error()
					firstTransportErr.CompareAndSwap(nil, &s)
					time.Sleep(10 * time.Millisecond)
					continue
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
				mu.Lock()
				if codes[path] == nil {
					codes[path] = map[int]int{}
				}
				codes[path][res.StatusCode]++
				if res.StatusCode == 200 {
					reqLatency[path] = append(reqLatency[path], time.Since(began))
				}
				mu.Unlock()
			}
		}()
	}
	loadBegan := time.Now()
	time.Sleep(time.Second)
	loaded := run("loaded")
	stop.Store(true)
	wg.Wait()
	loadTook := time.Since(loadBegan)

	r.figure("load", "%d clients for %s, sagas at %.0f/s in each phase of %s", clients, loadTook.Round(time.Second), rate, phase)
	keys := make([]string, 0, len(codes))
	for k := range codes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	total := 0
	for _, k := range keys {
		n := 0
		for _, c := range codes[k] {
			n += c
		}
		total += n
		r.figure("requests "+k, "%d (%.0f/s), status %v; answered 200 in %s", n, float64(n)/loadTook.Seconds(), codes[k], reqLatency[k])
	}
	if e := firstTransportErr.Load(); e != nil {
		r.figure("transport errors", "%d (first: %.120s)", transportErrs.Load(), *e)
	}
	r.figure("saga e2e unloaded", "%s", unloaded)
	r.figure("saga e2e under the flood", "%s", loaded)
	ratio := func(p float64) float64 { return loaded.pct(p).Seconds() / unloaded.pct(p).Seconds() }
	r.figure("ratio loaded/unloaded", "p50 %.2f×, p90 %.2f×, p99 %.2f×", ratio(50), ratio(90), ratio(99))
	r.head = fmt.Sprintf("%d monitor requests; saga p50 %s → %s (%.2f×)", total,
		unloaded.pct(50).Round(time.Millisecond), loaded.pct(50).Round(time.Millisecond), ratio(50))

	r.expect(len(unloaded) > 0 && len(loaded) > 0, "sagas completed in both phases", "%d and %d", len(unloaded), len(loaded))
	r.expect(total >= clients, "the monitor answered the flood (paced, not dropped)", "%d answers", total)
	r.expect(codes["/v1/sagas?limit=100"][200] > 0 && codes["/metrics"][200] > 0, "scrapes and lists were served, not only refused", "%v", codes)
	r.expect(ratio(50) <= 2, "saga end-to-end latency (p50) within 2× of unloaded", "%.2f×", ratio(50))
	r.expect(ratio(90) <= 2, "saga end-to-end latency (p90) within 2× of unloaded", "%.2f×", ratio(90))
	if out, ok := relay.Stop(30 * time.Second); !ok {
		r.expect(false, "the relay stops cleanly after the flood", "%s", out)
	}
	r.keepLog("relay", relay.Output())
}

func dbNow(t *testing.T, tg *target) time.Time {
	t.Helper()
	var now time.Time
	if err := tg.Pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now
}

// sagaLatencies are, for the briefs committed between from and to, the
// times from the trigger's commit to the instance's last write (COMPLETED).
func sagaLatencies(t *testing.T, tg *target, from, to time.Time) durations {
	t.Helper()
	rows, err := tg.Pool.Query(context.Background(), `
SELECT extract(epoch FROM i.updated_at - o.created_at)
FROM saga_instances i JOIN outbox o ON o.id = i.trigger_event_id
WHERE i.status = 'COMPLETED' AND o.created_at BETWEEN $1 AND $2`, from, to)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out durations
	for rows.Next() {
		var s float64
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, time.Duration(s*float64(time.Second)))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
