package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSagasValidateFlow: relay sagas validate lists when and wait steps,
// and reports their misuse at file:line:col with a fix; relay sagas test
// shows a skip and a wait.
func TestSagasValidateFlow(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := `saga: cool_off
version: 1
triggers: [{event_type: order.placed}]
steps:
  - name: gift
    when: "${ trigger.payload.gold }"
    emit: [{event_type: gift.wrapped}]
  - name: pause
    wait: {duration: 2h}
  - name: ship
    command: {event_type: ship.requested, reply_timeout: 1m, on_timeout: fail}
`
	f := filepath.Join(dir, "cool_off.yaml")
	if err := os.WriteFile(f, []byte(good), 0o600); err != nil {
		t.Fatal(err)
	}
	out, code := runDeclaredCLI(t, "sagas", "validate", dir)
	want := "cool_off v1  triggers: order.placed  steps: gift (emit, when) → pause (wait) → ship (command)\n"
	if code != 0 || out != want {
		t.Fatalf("exit %d:\n%s\nwant:\n%s", code, out, want)
	}
	out, code = runDeclaredCLI(t, "sagas", "test", f, "--trigger", `{"event_type":"order.placed","payload":{"gold":false}}`)
	if code != 0 || !strings.Contains(out, "1. gift (emit)\n   skipped (when is false)\n") || !strings.Contains(out, "2. pause (wait)\n   waits 2h") {
		t.Fatalf("exit %d:\n%s", code, out)
	}

	bad := strings.NewReplacer(`"${ trigger.payload.gold }"`, `"${ trigger.payload.gold + 1 }"`, "{duration: 2h}", "{}", "on_timeout: fail", "on_timeout: give_up").Replace(good)
	if err := os.WriteFile(f, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	out, code = runDeclaredCLI(t, "sagas", "validate", dir)
	for _, line := range []string{
		f + ":6:14: step gift.when gives int, not true or false",
		f + ":9:5: step pause.wait says neither how long nor until when; give duration: 2h or until:",
		f + ":11:74: steps[2].command.on_timeout is give_up; use one of: retry, compensate, fail",
	} {
		if code != 2 || !strings.Contains(out, line) {
			t.Errorf("exit %d, output lacks %q:\n%s", code, line, out)
		}
	}
}
