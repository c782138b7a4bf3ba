package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestAMissingOrMalformedDatabaseURLExits2 runs the real commands (not the
// stubbed tree of strict_test.go) that read --database-url: a missing or
// unparsable DSN is a usage error, exit 2, whichever command it is.
func TestAMissingOrMalformedDatabaseURLExits2(t *testing.T) {
	clearRelayEnv(t)
	const id = "00000000-0000-0000-0000-000000000001"
	cmds := [][]string{
		{"lag"},
		{"sagas", "list"},
		{"sagas", "show", id},
		{"sagas", "retry", id, "--reason", "test"},
		{"sagas", "cancel", id, "--reason", "test"},
		{"deadletters", "list"},
		{"sinks", "list"},
		{"migrate"},
		{"run", "--http-addr", "127.0.0.1:0"},
	}
	for _, c := range cmds {
		for _, dsn := range []string{"", "postgres://u:p@localhost:99999/db"} {
			args := append([]string(nil), c...)
			if dsn != "" {
				args = append(args, "--database-url", dsn)
			}
			opts := &rootOptions{}
			var stdout, stderr bytes.Buffer
			root := newRootCmd(opts)
			root.SetOut(&stdout)
			root.SetErr(&stderr)
			code := execute(context.Background(), root, opts, args, &stderr)
			if code != 2 || !strings.Contains(stderr.String(), "--database-url") || strings.Contains(stderr.String(), "u:p") {
				t.Errorf("relay %s (DSN %q): exit %d, stderr %q; want exit 2 naming --database-url", strings.Join(c, " "), dsn, code, stderr.String())
			}
		}
	}
}
