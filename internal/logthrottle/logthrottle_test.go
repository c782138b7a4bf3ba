package logthrottle

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

type lines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lines) records(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.buf.String()), "\n") {
		if line == "" {
			continue
		}
		m := map[string]any{}
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// clock is a fake time source the test moves by hand.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }
func newThrottle(out *lines, c *clock) *Throttle {
	th := New(slog.New(slog.NewJSONHandler(out, nil)), time.Minute)
	th.now = c.now
	return th
}

func TestRepeatsAreLoggedOncePerIntervalWithACount(t *testing.T) {
	t.Parallel()
	var out lines
	c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	th := newThrottle(&out, c)

	// 170 failures over 59 s, then one more at 60 s: two lines.
	start := c.t
	wrote := 0
	for i := range 171 {
		c.t = start.Add(time.Duration(i) * time.Minute / 170)
		if th.Warn("db", "database unreachable", "err", "connection refused") {
			wrote++
		}
	}
	recs := out.records(t)
	if wrote != 2 || len(recs) != 2 {
		t.Fatalf("wrote %d lines (%d records), want 2: %v", wrote, len(recs), recs)
	}
	if recs[0]["msg"] != "database unreachable" || recs[0]["level"] != "WARN" || recs[0]["err"] != "connection refused" {
		t.Errorf("first line: %v", recs[0])
	}
	if recs[1]["msg"] != "database unreachable (repeated 170 times in the last 60 s)" {
		t.Errorf("second line: %v", recs[1]["msg"])
	}

	// Another key of the same component is throttled on its own.
	if !th.Error("broker", "broker down") {
		t.Error("a different key's first failure was not logged")
	}
	if th.Error("broker", "broker down") {
		t.Error("a different key's repeat was logged at once")
	}

	// The recovery is always logged, with the count and the duration.
	c.advance(10 * time.Second)
	if !th.Recovered("db", "database reachable again") {
		t.Fatal("recovery not logged")
	}
	recs = out.records(t)
	last := recs[len(recs)-1]
	if last["msg"] != "database reachable again" || last["level"] != "INFO" || last["failures"] != float64(171) || last["failing_for"] != "1m10s" {
		t.Errorf("recovery line: %v", last)
	}
	// A recovery without a failure is silent; the next failure is a first
	// occurrence again.
	if th.Recovered("db", "database reachable again") {
		t.Error("a second recovery was logged")
	}
	if !th.Warn("db", "database unreachable") {
		t.Error("the first failure after a recovery was not logged")
	}
	if !th.Failing("db") || th.Failing("nothing") {
		t.Error("Failing does not match")
	}
}

func TestQuietFailureLogsAfterTheIntervalWithTheElapsedTime(t *testing.T) {
	t.Parallel()
	var out lines
	c := &clock{t: time.Unix(0, 0)}
	th := newThrottle(&out, c)
	th.Warn("k", "stalled")
	c.advance(5 * time.Minute)
	if !th.Warn("k", "stalled") {
		t.Fatal("an occurrence after the interval was not logged")
	}
	recs := out.records(t)
	if got := recs[len(recs)-1]["msg"]; got != "stalled (repeated 1 times in the last 300 s)" {
		t.Errorf("line: %v", got)
	}
}

func TestConcurrentUse(t *testing.T) {
	t.Parallel()
	var out lines
	th := New(slog.New(slog.NewJSONHandler(&out, nil)), time.Hour)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				th.Warn("k", "x")
			}
		}()
	}
	wg.Wait()
	if n := len(out.records(t)); n != 1 {
		t.Errorf("%d lines from 8000 failures within the interval, want 1", n)
	}
}
