package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runCLI runs the real CLI (actions included) and returns the exit code and stderr.
func runCLI(args ...string) (int, string) {
	opts := &rootOptions{}
	root := newRootCmd(opts)
	var stdout, stderr bytes.Buffer
	root.SetOut(&stdout)
	root.SetErr(&stderr)
	code := execute(context.Background(), root, opts, args, &stderr)
	return code, stderr.String()
}

func TestSinksValidate(t *testing.T) {
	code, stderr := runCLI("sinks", "validate", "../../sink/testdata/sinks.yaml")
	if code != 0 {
		t.Fatalf("the example sinks file: exit %d, %s", code, stderr)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("sinks:\n  - name: x\n    webhok: {url: 'http://a'}\n  - name: y\n    nats: {url: 'nats://h:1'}\n"), 0o600)
	code, stderr = runCLI("sinks", "validate", bad)
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	if code != 2 || len(lines) != 4 {
		t.Fatalf("exit %d, stderr:\n%s\nwant exit 2, three problems and a summary", code, stderr)
	}
	for _, want := range []string{bad + `:3:5: unknown key "webhok" in a sink`, bad + `:2:5: sink "x" names no destination`,
		bad + `:5:11: nats has no "stream"`, "relay: " + bad + ": 3 problems"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("missing %q in:\n%s", want, stderr)
		}
	}
	if code, _ := runCLI("sinks", "validate"); code != 2 {
		t.Errorf("no FILE: exit %d, want 2", code)
	}
}

// A webhook sink without secret_env is valid, but its requests go out
// unsigned: sinks validate says so, naming the sink and its line, exit 0.
func TestSinksValidateWarnsOfAnUnsignedWebhook(t *testing.T) {
	file := filepath.Join(t.TempDir(), "sinks.yaml")
	os.WriteFile(file, []byte("sinks:\n  - name: signed\n    webhook: {url: 'http://a/x', secret_env: S}\n  - name: open\n    webhook: {url: 'http://a/y'}\n"), 0o600)
	code, stderr := runCLI("sinks", "validate", file)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	want := file + `:4: warning: sink "open": webhook without secret_env sends unsigned requests`
	if !strings.Contains(stderr, want) || strings.Count(stderr, "warning") != 1 {
		t.Errorf("stderr:\n%s\nwant one line with %q", stderr, want)
	}
	if code, stderr := runCLI("sinks", "validate", "../../sink/testdata/sinks.yaml"); code != 0 || strings.Contains(stderr, "warning") {
		t.Errorf("a signed webhook: exit %d, %q", code, stderr)
	}
}
