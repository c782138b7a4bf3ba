package relay_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/relay"
	"github.com/compensa/compensa/test/testkit"
)

// dbDown is how long TestDatabaseDownLogsLittleAndRecovers keeps the
// database down: 10 s, or 60 s with RELAY_TEST_HEAVY=1 (make test-db-down).
var dbDown = func() time.Duration {
	if testkit.Heavy() {
		return 60 * time.Second
	}
	return 10 * time.Second
}()

// The database goes away for a while (10 s; 60 s with RELAY_TEST_HEAVY=1,
// make test-db-down) under a relay that streams, runs sagas and is
// probed on /readyz every second: it says unready with the reason, writes
// fewer than 20 log lines per minute down (each component logs the first
// failure, then once a minute with a count), logs its recovery, and goes on
// without a restart.
func TestDatabaseDownLogsLittleAndRecovers(t *testing.T) {
	testkit.SkipShort(t, "keeps the database down for 10 s")
	t.Parallel()
	ctx := context.Background()
	c, url := haltableDB(t, "dbdown")
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	var logs logLines
	r := startRelay(t, relay.Config{
		DatabaseURL: url, Registry: orderRegistry(t), Workers: 2,
		StatusInterval: 200 * time.Millisecond, HeartbeatInterval: 500 * time.Millisecond,
		HTTPAddr: "127.0.0.1:0", StallAfter: 5 * time.Second, Logger: logs.logger(),
	})
	steps := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM relay_test_steps`).Scan(&n); err != nil {
			return -1
		}
		return n
	}
	writeOrder(t, pool, "before")
	testkit.WaitFor(t, 30*time.Second, "the first saga's steps", func() bool { return steps() == 2 })
	testkit.WaitFor(t, 10*time.Second, "/readyz ready", func() bool { return probe(t, r.Addr()).status == 200 })

	// A probe every second, as an orchestrator would.
	probeCtx, stopProbes := context.WithCancel(ctx)
	probes := make(chan readiness, 1000)
	probesDone := make(chan struct{})
	go func() {
		defer close(probesDone)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-probeCtx.Done():
				return
			case <-tick.C:
			}
			asked := time.Now()
			resp, err := http.Get("http://" + r.Addr() + "/readyz")
			if err != nil {
				continue
			}
			rd := readiness{status: resp.StatusCode, asked: asked, answered: time.Now()}
			var b strings.Builder
			buf := make([]byte, 4096)
			for {
				n, err := resp.Body.Read(buf)
				b.Write(buf[:n])
				if err != nil {
					break
				}
			}
			resp.Body.Close()
			rd.body = b.String()
			select {
			case probes <- rd:
			default:
			}
		}
	}()
	defer func() { stopProbes(); <-probesDone }()

	down := dbDown
	halted := time.Now()
	if err := c.Halt(true); err != nil {
		t.Fatal(err)
	}
	time.Sleep(down)
	resumed := time.Now()
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	err = c.Resume(rctx)
	cancel()
	if err != nil {
		t.Fatalf("start PostgreSQL again: %v", err)
	}
	lines := logs.between(halted, resumed)
	var msgs []string
	for _, m := range lines {
		msgs = append(msgs, fmt.Sprintf("%v %v: %v", m["level"], m["component"], m["msg"]))
	}
	t.Logf("%d log lines in the %s the database was down:\n%s", len(lines), down, strings.Join(msgs, "\n"))
	// Each component logs its first failure at once; after that, a line a
	// minute per failure. 20 a minute is the bound; a longer outage may
	// add its share.
	bound := max(20, int(20*down/time.Minute))
	if len(lines) >= bound {
		t.Errorf("%d log lines in %s down, want fewer than %d", len(lines), down, bound)
	}

	stopProbes()
	<-probesDone
	close(probes)
	unready := 0
	for rd := range probes {
		// A probe that straddles the restart may find the database back
		// and the stream not yet: only those answered while it was down
		// must name it.
		if rd.status == http.StatusServiceUnavailable && rd.asked.After(halted) && rd.answered.Before(resumed) {
			unready++
			if !strings.Contains(rd.body, "database unreachable") {
				t.Errorf("/readyz while the database is down: %s", rd.body)
			}
		}
	}
	if unready == 0 {
		t.Error("/readyz never said unready while the database was down")
	}

	// Recovery: logged, ready again, and the stream and the runner go on.
	writeOrder(t, pool, "after")
	testkit.WaitFor(t, 60*time.Second, "the saga of an event written after the restart", func() bool { return steps() == 4 })
	testkit.WaitFor(t, 30*time.Second, "/readyz ready after the restart", func() bool { return probe(t, r.Addr()).status == 200 })
	after := logs.between(resumed, time.Now())
	if withMsg(after, "stream recovered") != 1 {
		t.Errorf("the stream's recovery is not logged once; lines since the restart: %v", after)
	}
	if withMsg(after, "readyz: database reachable again") != 1 {
		t.Errorf("the monitor's recovery is not logged once; lines since the restart: %v", after)
	}
	select {
	case <-r.Done():
		t.Fatalf("the relay stopped: %v", r.Err())
	default:
	}
}
