package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runCLIOut runs the real CLI and returns the exit code, stdout and stderr.
func runCLIOut(args ...string) (int, string, string) {
	opts := &rootOptions{}
	root := newRootCmd(opts)
	var stdout, stderr bytes.Buffer
	root.SetOut(&stdout)
	root.SetErr(&stderr)
	code := execute(context.Background(), root, opts, args, &stderr)
	return code, stdout.String(), stderr.String()
}

// TestSinksTest: `relay sinks test` shows, per sink, the message it would
// send or why not, with no broker or database; --json says the same.
func TestSinksTest(t *testing.T) {
	t.Setenv("RELAY_DATABASE_URL", "")
	t.Setenv("DATABASE_URL", "")
	file := "../../sink/testdata/cloudevents.yaml"
	event := `{"id":"e-1","event_type":"order.placed","aggregate_type":"order","aggregate_id":"o-1","payload":{"amount":120,"region":"eu.>"}}`
	code, out, stderr := runCLIOut("sinks", "test", file, "--database-url", "postgres://u:hunter2@db.example/shop", "--event", event)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{
		"sink billing (webhook): deliver\n  to POST http://127.0.0.1:8099/billing",
		"Ce-Source: /shop/orders",
		`{"label":"order o-1 in eu.>","large":true,"order":"o-1","total":120}`,
		`"source":"/compensa/shop/public.outbox"`,
		"sink bus (nats): deliver\n  to outbox.eu__.order.placed",
		"ce-id: e-1",
		"sink kafka (kafka): deliver\n  to outbox.event.shared\n  key o-1",
		"ce_type: order.placed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
	if strings.Contains(out+stderr, "hunter2") {
		t.Error("the password of --database-url is shown")
	}

	// Filtered out, and an expression that fails (what the relay parks).
	code, out, _ = runCLIOut("sinks", "test", file, "--json", "--event", `{"event_type":"order.placed","payload":{"amount":5}}`)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	var res struct {
		Sinks []struct{ Sink, Outcome, Reason, Destination string }
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	got := map[string]string{}
	for _, s := range res.Sinks {
		got[s.Sink] = s.Outcome + ": " + s.Reason
	}
	if !strings.HasPrefix(got["billing"], "filtered out: its filter ${ event.payload.amount >= 100 } rejects") ||
		!strings.HasPrefix(got["audit"], "deliver") ||
		!strings.HasPrefix(got["bus"], "refused: template outbox.${ event.payload.region }.{raw(event_type)}: expression ${ event.payload.region } failed") {
		t.Errorf("outcomes %v", got)
	}

	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("sinks:\n  - name: a\n    filter: \"${ event.nope( }\"\n    webhook: { url: \"http://127.0.0.1:1/\" }\n"), 0o600)
	if code, _, stderr := runCLIOut("sinks", "test", bad, "--event", event); code != 2 || !strings.Contains(stderr, "bad.yaml:3:") {
		t.Errorf("a bad file: exit %d, %s", code, stderr)
	}
	if code, _, stderr := runCLIOut("sinks", "test", file, "--event", `{"event_typ":"x"}`); code != 2 || !strings.Contains(stderr, "--event is not an event") {
		t.Errorf("a bad event: exit %d, %s", code, stderr)
	}
}
