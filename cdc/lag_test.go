package cdc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

func TestQueryLagReportsTheSlot(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	if _, err := cdc.QueryLag(ctx, db.Pool, db.Slot); !errors.Is(err, cdc.ErrSlotNotFound) {
		t.Fatalf("QueryLag of a missing slot = %v, want ErrSlotNotFound", err)
	}
	sink := newSink(t, db.Pool)
	r := startStream(t, baseConfig(t, db), sink)
	writeEvents(t, db.Pool, 2, "x")
	testkit.WaitFor(t, 20*time.Second, "events", func() bool { return countHandled(t, db.Pool) == 2 })
	testkit.WaitFor(t, 10*time.Second, "an active slot", func() bool { _, active := slotState(t, db.Pool, db.Slot); return active })

	rep, err := cdc.QueryLag(ctx, db.Pool, db.Slot)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Slot != db.Slot || !rep.Active || rep.WALStatus != "reserved" || rep.LagBytes < 0 || rep.LagSeconds == nil || *rep.LagSeconds > 30 {
		t.Fatalf("report %+v", rep)
	}
	for _, s := range []string{rep.ConfirmedFlushLSN, rep.CurrentLSN} {
		if _, err := pglogrepl.ParseLSN(s); err != nil {
			t.Fatalf("LSN %q: %v", s, err)
		}
	}

	var buf bytes.Buffer
	if err := cdc.WriteLag(&buf, rep, true); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(buf.String(), "}\n") || strings.Count(buf.String(), "\n") != 1 {
		t.Fatalf("JSON output is not one object per line: %q", buf.String())
	}
	var obj map[string]any
	if err := json.Unmarshal(buf.Bytes(), &obj); err != nil {
		t.Fatal(err)
	}
	want := []string{"active", "confirmed_flush_lsn", "current_lsn", "failover", "failover_ready", "lag_bytes", "lag_seconds", "slot", "synchronized_standby_slots", "wal_status"}
	if got := slices.Sorted(maps.Keys(obj)); !slices.Equal(got, want) {
		t.Fatalf("JSON keys %v, want %v", got, want)
	}
	buf.Reset()
	if err := cdc.WriteLag(&buf, cdc.LagReport{Slot: "s", Active: true, WALStatus: "reserved", LagBytes: 3 << 20, ConfirmedFlushLSN: "0/1", CurrentLSN: "0/2"}, false); err != nil {
		t.Fatal(err)
	}
	if line := buf.String(); !strings.Contains(line, "3.0 MiB (3145728 bytes)") || !strings.Contains(line, "slot s") || !strings.Contains(line, "wal_status=reserved") {
		t.Fatalf("human line %q", line)
	}

	// The slot is active from START_REPLICATION on; the stream reports its
	// flush position once its session has begun, a moment later.
	testkit.WaitFor(t, 10*time.Second, "the stream's flush position", func() bool { return r.s.Lag().FlushLSN != 0 })
	lag := r.s.Lag()
	if !lag.Leader || lag.Slot != db.Slot || lag.FlushLSN == 0 || lag.LastCommit.IsZero() || lag.Seconds > 30 {
		t.Fatalf("Stream.Lag() = %+v", lag)
	}
	r.stop(t)
	if r.s.Lag().Leader {
		t.Fatal("a stopped stream reports itself leader")
	}
}

func TestHumanBytes(t *testing.T) {
	t.Parallel()
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB", 5 << 30: "5.0 GiB"} {
		if got := cdc.HumanBytes(n); got != want {
			t.Errorf("HumanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// lagIdle is how long TestLagIsTheAgeOfTheOldestUnhandledChange watches an
// idle stream: 15 s, or the full minute with RELAY_TEST_HEAVY=1 (make
// test-lag-idle).
var lagIdle = func() time.Duration {
	if testkit.Heavy() {
		return time.Minute
	}
	return 15 * time.Second
}()

// TestLagIsTheAgeOfTheOldestUnhandledChange: an idle stream reports a lag
// under a second in memory and through QueryLag, across many heartbeats
// (the age of the last heartbeat would saw-tooth up to the interval); a
// stream whose sink stops consuming reports the age of the oldest change it
// has not handled, growing with it, not the age of newer ones.
func TestLagIsTheAgeOfTheOldestUnhandledChange(t *testing.T) {
	testkit.SkipShort(t, "watches an idle stream for 15 s")
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	sink := newSink(t, db.Pool)
	release := make(chan struct{})
	sink.setBefore(func(ctx context.Context, b cdc.Batch) error {
		for _, e := range b.Events {
			if e.EventType == "stuck" {
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
		return nil
	})
	cfg := baseConfig(t, db)
	cfg.HeartbeatInterval = 2 * time.Second
	r := startStream(t, cfg, sink)
	writeEvents(t, db.Pool, 3, "x")
	testkit.WaitFor(t, 20*time.Second, "events", func() bool { return countHandled(t, db.Pool) == 3 })

	read := func() (mem, query float64) {
		t.Helper()
		rep, err := cdc.QueryLag(ctx, db.Pool, db.Slot)
		if err != nil {
			t.Fatal(err)
		}
		if rep.LagSeconds == nil {
			t.Fatalf("QueryLag reports no lag_seconds: %+v", rep)
		}
		return r.s.Lag().Seconds, *rep.LagSeconds
	}

	idleUntil := time.Now().Add(lagIdle)
	worstMem, worstQuery := 0.0, 0.0
	samples := 0
	for time.Now().Before(idleUntil) {
		mem, query := read()
		worstMem, worstQuery = max(worstMem, mem), max(worstQuery, query)
		samples++
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("idle for %s (%d samples, heartbeat every %s): worst lag %.3fs in memory, %.3fs from QueryLag", lagIdle, samples, cfg.HeartbeatInterval, worstMem, worstQuery)
	if worstMem >= 1 || worstQuery >= 1 {
		t.Fatalf("an idle stream reported a lag of %.3fs in memory and %.3fs from QueryLag, want < 1s", worstMem, worstQuery)
	}

	// The sink stops consuming at the "stuck" row; newer rows queue behind it.
	stuckAt := time.Now()
	writeEvents(t, db.Pool, 1, "stuck")
	time.Sleep(1500 * time.Millisecond)
	writeEvents(t, db.Pool, 1, "x")
	var prevMem, prevQuery float64
	for i := range 3 {
		time.Sleep(1500 * time.Millisecond)
		mem, query := read()
		age := time.Since(stuckAt).Seconds()
		t.Logf("stuck for %.1fs: lag %.3fs in memory, %.3fs from QueryLag", age, mem, query)
		for name, got := range map[string]float64{"in memory": mem, "from QueryLag": query} {
			if got < age-0.5 || got > age+0.5 {
				t.Fatalf("lag %s = %.3fs, want the age of the oldest unhandled row, %.3fs", name, got, age)
			}
		}
		if i > 0 && (mem < prevMem+1 || query < prevQuery+1) {
			t.Fatalf("lag does not grow: %.3f→%.3f in memory, %.3f→%.3f from QueryLag", prevMem, mem, prevQuery, query)
		}
		prevMem, prevQuery = mem, query
	}
	close(release)
	testkit.WaitFor(t, 20*time.Second, "the stuck rows", func() bool { return countHandled(t, db.Pool) == 5 })
	testkit.WaitFor(t, 10*time.Second, "the lag back under a second", func() bool {
		mem, query := read()
		return mem < 1 && query < 1
	})
}
