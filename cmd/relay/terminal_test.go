package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/compensa/compensa/internal/briefs"
	"github.com/compensa/compensa/migrations"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/pgjournal"
)

// hostile is what a step error or a retry reason may hold: a colour
// change, an OSC 8 link that shows one address and opens another, a C1
// CSI, DEL, a forged newline and a NUL-free BEL.
const hostile = "\x1b[31mred\x1b[0m \x1b]8;;https://evil.example\x07click\x1b]8;;\x07 \u009b2J \x7f end"

// terminalUnsafe reports a byte or rune a terminal would obey.
func terminalUnsafe(out string) string {
	for _, r := range out {
		if r == '\t' || r == '\n' {
			continue
		}
		if r < 0x20 || r == 0x7f || r >= 0x80 && r <= 0x9f {
			return strings.ToValidUTF8(string(r), "?")
		}
	}
	return ""
}

// TestCLIEscapesControlCharacters: `relay sagas list` and `show`, as text
// and JSON, print a step error and a journaled reason holding escape
// sequences as visible escapes, never raw.
func TestCLIEscapesControlCharacters(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, pool := migratedCluster(ctx, t, migrations.Options{})
	j, err := pgjournal.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	id := uuid.New()
	if err := j.Enqueue(ctx, saga.Instance{ID: id, TenantID: uuid.New(), SagaName: briefs.SagaName, SagaVersion: briefs.SagaVersion,
		Status: saga.StatusRunning, TriggerEventID: uuid.New(), Context: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	claimed, err := j.ClaimPending(ctx, 1, time.Minute)
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	lease := claimed[0].LeaseID.UUID
	for _, ev := range []saga.Event{
		{Kind: saga.EventStepCompleted, Step: 0, StepName: briefs.StepClaim},
		{Kind: saga.EventCompensationStarted, Step: 0, Reason: hostile},
		{Kind: saga.EventCompensationFailed, Step: 0, StepName: briefs.StepClaim, Error: hostile},
	} {
		if _, err := j.Append(ctx, id, lease, ev); err != nil {
			t.Fatalf("append %s: %v", ev.Kind, err)
		}
	}
	if ok, err := j.MarkTerminal(ctx, id, lease, saga.StatusFailed, hostile); !ok || err != nil {
		t.Fatalf("MarkTerminal: %v %v", ok, err)
	}
	// A reason journaled by an older relay, before the API refused them.
	if err := j.RequestRetry(ctx, id, hostile, "api:127.0.0.1"); err != nil {
		t.Fatal(err)
	}

	for _, args := range [][]string{
		{"sagas", "list"}, {"sagas", "list", "--json"},
		{"sagas", "show", id.String()}, {"sagas", "show", id.String(), "--json"},
	} {
		out, err := runSagas(t, c.URL, args...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if bad := terminalUnsafe(out); bad != "" {
			t.Errorf("relay %s printed the control character %q raw:\n%s", strings.Join(args, " "), bad, out)
		}
		if !strings.Contains(out, `\u001b[31mred`) {
			t.Errorf("relay %s does not show the escape as \\u001b:\n%s", strings.Join(args, " "), out)
		}
		if strings.HasSuffix(args[len(args)-1], "json") && !json.Valid([]byte(out)) {
			t.Errorf("relay %s: escaped output is not JSON any more:\n%s", strings.Join(args, " "), out)
		}
	}
}

func TestEscapeTerm(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"plain ünïcode — ok\tx\n": "plain ünïcode — ok\tx\n",
		"\x1b[1m":                 `\u001b[1m`,
		"a\u0085b\u009bc":         `a\u0085b\u009bc`,
		"bad \xff byte":           `bad \xff byte`,
		"del\x7f":                 `del\u007f`,
	} {
		if got := escapeTerm(in, "\t\n"); got != want {
			t.Errorf("escapeTerm(%q) = %q, want %q", in, got, want)
		}
	}
	if got := termSafe("two\nlines\x00"); got != `two\u000alines\u0000` {
		t.Errorf("termSafe: %q", got)
	}
}

// FuzzEscapeTerm: whatever the database holds, what reaches the terminal
// has no control character but tab and newline, and is valid UTF-8.
func FuzzEscapeTerm(f *testing.F) {
	for _, s := range []string{hostile, "plain", "\xff\xfe", "\u0085\u009b", "\x00\x7f", "é\u2028"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var buf strings.Builder
		if _, err := newTermWriter(&buf).Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
		out := buf.String()
		if bad := terminalUnsafe(out); bad != "" || !utf8.ValidString(out) {
			t.Fatalf("escapeTerm(%q) = %q still holds %q", s, out, bad)
		}
		if clean([]byte(s)) && out != s {
			t.Fatalf("clean text changed: %q -> %q", s, out)
		}
	})
}

// TestReasonControlCharsRefusedByCLI: the CLI refuses what the API refuses,
// before connecting.
func TestReasonControlCharsRefusedByCLI(t *testing.T) {
	t.Parallel()
	id := uuid.NewString()
	for _, args := range [][]string{
		{"sagas", "retry", id, "--reason", "fixed\x1b]8;;https://evil.example\x07"},
		{"sagas", "cancel", id, "--reason", "two\nlines"},
	} {
		if _, err := runSagas(t, "postgres://nobody@127.0.0.1:1/none", args...); err == nil || !strings.Contains(err.Error(), "control characters") {
			t.Errorf("relay %s: %v, want a refusal", strings.Join(args[:2], " "), err)
		}
	}
}
