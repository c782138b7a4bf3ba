package cliflag

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/pflag"
)

// Every value says what it wants.
var (
	_ Value = (*Enum)(nil)
	_ Value = (*Int)(nil)
	_ Value = (*Duration)(nil)
	_ Value = (*Text)(nil)
	_ Value = (*UUID)(nil)
	_ Value = (*Pairs[string, int])(nil)
)

// check sets each value on v and compares what it stored (String) or the
// refusal, which must be one line starting "want ".
func check(t *testing.T, v Value, cases map[string]string) {
	t.Helper()
	for in, want := range cases {
		err := v.Set(in)
		switch {
		case strings.HasPrefix(want, "want "):
			if err == nil {
				t.Errorf("%s: Set(%q) took it (%q), want %q", v.Type(), in, v.String(), want)
			} else if err.Error() != want {
				t.Errorf("%s: Set(%q) = %q, want %q", v.Type(), in, err, want)
			}
		case err != nil:
			t.Errorf("%s: Set(%q) = %v, want it taken", v.Type(), in, err)
		case v.String() != want:
			t.Errorf("%s: after Set(%q) it is %q, want %q", v.Type(), in, v.String(), want)
		}
	}
}

func TestEnum(t *testing.T) {
	t.Parallel()
	var s string
	e := NewEnum(&s, "fair", "fair|oldest", "fair", "oldest")
	if s != "fair" || e.Type() != "fair|oldest" {
		t.Fatalf("NewEnum: %q, type %q", s, e.Type())
	}
	check(t, e, map[string]string{
		"oldest": "oldest",
		"olde":   `want one of fair, oldest; did you mean "oldest"?`,
		"random": "want one of fair, oldest",
		"":       "want one of fair, oldest",
		"FAIR":   `want one of fair, oldest; did you mean "fair"?`, // exactly, case too
	})
	var st string
	check(t, NewEnum(&st, "", "status", "RUNNING", "FAILED").Optional(), map[string]string{
		"":         "",
		"FAILED":   "FAILED",
		"RUNNNING": `want one of RUNNING, FAILED; did you mean "RUNNING"?`,
	})
}

func TestInt(t *testing.T) {
	t.Parallel()
	var n int
	v := IntBetween(&n, 50, 1, 500)
	if n != 50 {
		t.Fatalf("IntBetween: starts at %d, want 50", n)
	}
	check(t, v, map[string]string{
		"1": "1", "500": "500",
		"0": "want a whole number from 1 to 500", "501": "want a whole number from 1 to 500",
		"1.5": "want a whole number from 1 to 500", "abc": "want a whole number from 1 to 500", "": "want a whole number from 1 to 500",
	})
	check(t, IntAtLeast(&n, 8, 0), map[string]string{
		"0": "0", "100000": "100000",
		"-1": "want a whole number of at least 0",
	})
}

func TestDuration(t *testing.T) {
	t.Parallel()
	var d time.Duration
	check(t, PositiveDuration(&d, time.Second), map[string]string{
		"1m30s": "1m30s",
		"0s":    "want a positive duration such as 30s, 5m or 1h",
		"0":     "want a positive duration such as 30s, 5m or 1h",
		"-1s":   "want a positive duration such as 30s, 5m or 1h",
		"10":    "want a positive duration such as 30s, 5m or 1h", // a unit is needed
	})
	check(t, OptionalDuration(&d, 0), map[string]string{
		"0s": "0", "24h": "24h0m0s",
		"-1h": "want a duration such as 30s, 5m or 24h, or 0 for off",
	})
	check(t, Retention(&d, 24*time.Hour), map[string]string{
		"0": "0", "720h": "720h0m0s",
		"x": "want a duration such as 1h, 24h or 720h, or 0 to keep forever",
	})
}

func TestText(t *testing.T) {
	t.Parallel()
	var s string
	check(t, TableName(&s, "outbox"), map[string]string{
		"events.outbox": "events.outbox",
		"a.b.c":         `want a table name such as outbox or events.outbox (outbox table "a.b.c": want name or schema.name, got 3 parts)`,
	})
	check(t, Address(&s, "127.0.0.1:8080"), map[string]string{
		":8080": ":8080", "[::1]:0": "[::1]:0",
		"8080": "want host:port such as 127.0.0.1:8080 or :8080", ":http": "want host:port such as 127.0.0.1:8080 or :8080",
		":65536": "want host:port such as 127.0.0.1:8080 or :8080", "": "want host:port such as 127.0.0.1:8080 or :8080",
	})
	check(t, Address(&s, "").Optional(), map[string]string{"": "", ":9090": ":9090"})
	check(t, SlotName(&s, "relay_outbox"), map[string]string{
		"slot_2": "slot_2",
		"Slot":   "want a replication slot name: 1 to 63 lower-case letters, digits or underscores",
		"":       "want a replication slot name: 1 to 63 lower-case letters, digits or underscores",
	})
	check(t, ColumnMap(&s, ""), map[string]string{"": "", "id=event_id": "id=event_id"})
	if err := ColumnMap(&s, "").Set("nosuchfield=x"); err == nil || !strings.HasPrefix(err.Error(), "want field=column,... (") {
		t.Errorf("ColumnMap: Set(nosuchfield=x) = %v", err)
	}
}

func TestUUID(t *testing.T) {
	t.Parallel()
	var id uuid.NullUUID
	check(t, NewUUID(&id), map[string]string{
		"0B7E6C2A-1F0E-4A57-9A43-5D2C1E6F8B90": "0b7e6c2a-1f0e-4a57-9a43-5d2c1e6f8b90",
		"":                                     "",
		"not-a-uuid":                           "want a UUID",
	})
}

func TestPairs(t *testing.T) {
	t.Parallel()
	var m map[string]int
	p := NewPairs(&m, "KEY=N", "want KEY=N", func(k, v string) (string, int, bool) {
		return k, len(v), v != ""
	})
	for _, s := range []string{"a=xx", "b=x=y"} {
		if err := p.Set(s); err != nil {
			t.Fatalf("Set(%q): %v", s, err)
		}
	}
	if p.String() != "a=2,b=3" {
		t.Errorf("String() = %q", p.String())
	}
	for in, want := range map[string]string{
		"c":   "want KEY=N",
		"=x":  "want KEY=N",
		"c=":  "want KEY=N",
		"a=z": "want each key once: a is given twice",
	} {
		if err := p.Set(in); err == nil || err.Error() != want {
			t.Errorf("Set(%q) = %v, want %q", in, err, want)
		}
	}
}

// The values declare their flags' defaults: pflag reads each one's String
// when the flag is added, and --help leaves a zero default out.
func TestDefaultsInHelp(t *testing.T) {
	t.Parallel()
	var (
		d    time.Duration
		n    int
		s    string
		id   uuid.NullUUID
		m    map[string]string
		fs   = pflag.NewFlagSet("t", pflag.ContinueOnError)
		pair = func(k, v string) (string, string, bool) { return k, v, true }
	)
	fs.Var(OptionalDuration(&d, 0), "off", "u")
	fs.Var(IntAtLeast(&n, 0, 0), "count", "u")
	fs.Var(NewEnum(&s, "", "word", "a").Optional(), "word", "u")
	fs.Var(NewUUID(&id), "tenant", "u")
	fs.Var(NewPairs(&m, "K=V", "want K=V", pair), "pair", "u")
	if usage := fs.FlagUsages(); strings.Contains(usage, "default") {
		t.Errorf("zero defaults shown:\n%s", usage)
	}
	var d2 time.Duration
	fs.Var(PositiveDuration(&d2, time.Minute), "every", "u")
	if usage := fs.FlagUsages(); !strings.Contains(usage, "--every duration   u (default 1m0s)") {
		t.Errorf("the default of --every is not shown:\n%s", usage)
	}
}
