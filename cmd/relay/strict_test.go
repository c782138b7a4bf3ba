package main

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/compensa/compensa/internal/cliflag"
)

var errRan = errors.New("the command ran")

// cliTree builds the CLI with every command's action replaced by one that
// only reports it ran: these tests exercise parsing and checking, never a
// database.
func cliTree() (*cobra.Command, *rootOptions) {
	opts := &rootOptions{}
	root := newRootCmd(opts)
	walk(root, func(c *cobra.Command) {
		if !isGroup(c) && c.Name() != "help" {
			c.RunE = func(*cobra.Command, []string) error { return errRan }
		}
	})
	return root, opts
}

// cli runs the CLI on args and returns the exit code and stderr.
func cli(t *testing.T, args ...string) (int, string) {
	t.Helper()
	root, opts := cliTree()
	var stderr, stdout bytes.Buffer
	root.SetOut(&stdout)
	root.SetErr(&stderr)
	code := execute(context.Background(), root, opts, args, &stderr)
	return code, stderr.String()
}

func clearRelayEnv(t *testing.T) {
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "RELAY_") || k == "DATABASE_URL" {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
}

type cliCommand struct {
	path   []string // without "relay"
	parent bool
	args   int // the most positional arguments the command takes (-1: any number)
	flags  []*pflag.Flag
}

func allCommands() []cliCommand {
	root, _ := cliTree()
	var out []cliCommand
	walk(root, func(c *cobra.Command) {
		if c.Name() == "help" {
			return
		}
		path := strings.Fields(c.CommandPath())[1:]
		cc := cliCommand{path: path, parent: isGroup(c)}
		if !cc.parent {
			// The most arguments the command takes: one more is a stray one.
			_, cc.args = acceptedArgs(c, c.Args)
		}
		add := func(f *pflag.Flag) {
			if f.Name != "help" {
				cc.flags = append(cc.flags, f)
			}
		}
		c.Flags().VisitAll(add)
		c.InheritedFlags().VisitAll(add)
		out = append(out, cc)
	})
	return out
}

// badValues are values each flag must refuse, by the value type it is
// declared with and the rule the declaration gives it.
func badValues(f *pflag.Flag) []string {
	switch v := f.Value.(type) {
	case *cliflag.Int:
		least, most := v.Range()
		bad := []string{"abc", "1.5", strconv.Itoa(least - 1)}
		if most < math.MaxInt {
			bad = append(bad, strconv.Itoa(most+1))
		}
		return bad
	case *cliflag.Duration:
		bad := []string{"abc", "-1s", "10"}
		if !v.ZeroOK() {
			bad = append(bad, "0s")
		}
		return bad
	case *cliflag.Enum:
		return []string{"bogus-word"}
	case *cliflag.UUID:
		return []string{"not-a-uuid"}
	case *cliflag.Pairs[uuid.UUID, int]:
		return []string{"no-equals-sign", "not-a-uuid=2", "00000000-0000-0000-0000-000000000001=0"}
	case *cliflag.Pairs[string, string]:
		return []string{"no-equals-sign", "=JSON"}
	case *cliflag.Text:
		switch f.Name {
		case "outbox-table":
			return []string{"a.b.c", ""}
		case "outbox-columns":
			return []string{"nosuchfield=x", "id"}
		case "http-addr":
			return []string{"8080", "localhost:http-ish", ""}
		case "probe-addr", "metrics-addr":
			return []string{"8080", "localhost:http-ish"}
		case "slot":
			return []string{"Has-Dash", ""}
		}
		panic("badValues: name values that --" + f.Name + " must refuse")
	}
	if f.Value.Type() == "bool" {
		return []string{"maybe"}
	}
	return nil
}

func oneLineNaming(t *testing.T, what string, code int, stderr string, want ...string) {
	t.Helper()
	if code != 2 {
		t.Errorf("%s: exit %d, want 2; stderr: %q", what, code, stderr)
		return
	}
	if lines := strings.Count(strings.TrimRight(stderr, "\n"), "\n") + 1; lines != 1 || stderr == "" {
		t.Errorf("%s: want one line on stderr, got %q", what, stderr)
	}
	for _, w := range want {
		if !strings.Contains(stderr, w) {
			t.Errorf("%s: stderr %q does not name %q", what, stderr, w)
		}
	}
}

// Every command, with a bogus subcommand, a stray argument and a bad value
// for each of its flags, exits 2 with one line naming what is wrong.
func TestEveryCommandRefusesBadInputWithExit2(t *testing.T) {
	clearRelayEnv(t)
	cmds := allCommands()
	if len(cmds) < 10 {
		t.Fatalf("walked only %d commands", len(cmds))
	}
	checked := 0
	for _, c := range cmds {
		name := "relay " + strings.Join(c.path, " ")
		args := append([]string(nil), c.path...)
		for i := 0; i < c.args; i++ {
			args = append(args, "00000000-0000-0000-0000-000000000001")
		}
		if c.parent {
			code, stderr := cli(t, append(args, "bogus")...)
			oneLineNaming(t, name+" bogus", code, stderr, `unknown command "bogus"`, "choose one of")
			code, stderr = cli(t, args...)
			oneLineNaming(t, name+" (no command)", code, stderr, "needs a command")
			continue
		}
		if c.args >= 0 {
			code, stderr := cli(t, append(args, "stray")...)
			oneLineNaming(t, name+" stray", code, stderr, `unexpected argument "stray"`, "usage: "+name)
		} else {
			t.Logf("%s takes any number of arguments: no stray one to refuse", name)
		}
		code, stderr := cli(t, append(args, "--bogus-flag")...)
		oneLineNaming(t, name+" --bogus-flag", code, stderr, "unknown flag --bogus-flag")
		for _, f := range c.flags {
			bad := badValues(f)
			if bad == nil {
				t.Logf("%s --%s: free-form %s, no value to refuse", name, f.Name, f.Value.Type())
			}
			for _, v := range bad {
				code, stderr := cli(t, append(args, "--"+f.Name+"="+v)...)
				oneLineNaming(t, name+" --"+f.Name+"="+v, code, stderr, "--"+f.Name, "want ")
				checked++
			}
		}
		// The same command with valid input gets through to its action.
		if code, stderr := cli(t, args...); code != 1 || !strings.Contains(stderr, errRan.Error()) {
			t.Errorf("%s with valid input: exit %d, %q; want it to run", name, code, stderr)
		}
	}
	t.Logf("%d commands, %d bad flag values refused", len(cmds), checked)
}

func TestCommonMistakesExitTwo(t *testing.T) {
	clearRelayEnv(t)
	cases := []struct {
		args []string
		want []string
	}{
		{[]string{"sagas", "bogus"}, []string{`unknown command "bogus" for "relay sagas"`}},
		{[]string{"deadletters", "lsit"}, []string{`unknown command "lsit" for "relay deadletters"; did you mean "list"?`}},
		{[]string{"run", "--bogus"}, []string{"unknown flag --bogus"}},
		{[]string{"run", "--workers", "abc"}, []string{`invalid value "abc" for --workers`}},
		{[]string{"run", "--workers", "0"}, []string{`invalid value "0" for --workers`, "at least 1"}},
		{[]string{"run", "--log-level", "verbose"}, []string{`invalid value "verbose" for --log-level`, "debug, info, warn, error"}},
		{[]string{"version", "--slot", "x"}, []string{`unknown flag --slot for "relay version"`}},
		{[]string{"demo", "--database-url", "postgres://x"}, []string{`unknown flag --database-url for "relay demo"`}},
		{[]string{"lag", "--intervl", "1s"}, []string{`did you mean "--interval"?`}},
		{[]string{"help", "sagas", "lsit"}, []string{`did you mean "list"?`}},
		{[]string{"sagas", "re"}, []string{`unknown command "re" for "relay sagas"; did you mean "replay", "resume" or "retry"?`}},
		{[]string{"sagas", ""}, []string{`unknown command "" for "relay sagas"; choose one of: cancel, list,`}},
		{[]string{"sagas", "list", "--status", "RUNNNING"}, []string{`invalid value "RUNNNING" for --status`, "PAUSED", `did you mean "RUNNING"?`}},
		{[]string{"run", "--claim-order", "olde"}, []string{`invalid value "olde" for --claim-order of "relay run": want one of fair, oldest; did you mean "oldest"?`}},
		{[]string{"run", "--tenant-weight", "00000000-0000-0000-0000-000000000001=1001"}, []string{"--tenant-weight", "N from 1 to 1000"}},
		{[]string{"run", "--workers"}, []string{`flag --workers of "relay run" needs a value (want a whole number of at least 1)`}},
		{[]string{"sagas", "list", "--limit", "9999"}, []string{`invalid value "9999" for --limit`, "from 1 to 500"}},
		{[]string{"sagas", "retry", "--filter", "saga=x", "--limit", "10001"}, []string{"from 1 to 10000"}},
		{[]string{"deadletters", "list", "--limit", "1001"}, []string{"from 1 to 1000"}},
		{[]string{"sinks", "parked", "x", "--limit", "1001"}, []string{"from 1 to 1000"}},
	}
	for _, tc := range cases {
		code, stderr := cli(t, tc.args...)
		oneLineNaming(t, strings.Join(tc.args, " "), code, stderr, tc.want...)
	}
	// A bad value from the environment is refused the same way.
	t.Setenv("RELAY_WORKERS", "0")
	code, stderr := cli(t, "run")
	oneLineNaming(t, "RELAY_WORKERS=0 relay run", code, stderr, "RELAY_WORKERS", "at least 1")
	t.Setenv("RELAY_WORKERS", "")
	os.Unsetenv("RELAY_WORKERS")
	t.Setenv("RELAY_CLAIM_ORDER", "random")
	code, stderr = cli(t, "run")
	oneLineNaming(t, "RELAY_CLAIM_ORDER=random relay run", code, stderr, `RELAY_CLAIM_ORDER="random": want one of fair, oldest`)
}

// Values only the command itself can judge (a --filter's status, a
// --cursor) are refused before it connects: exit 2, one line, with a
// database URL nothing answers.
func TestFilterAndCursorValuesAreUsageErrors(t *testing.T) {
	clearRelayEnv(t)
	db := "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"
	cases := []struct {
		args []string
		want []string
	}{
		{[]string{"sagas", "list", "--cursor", "garbage"}, []string{"cursor is malformed"}},
		{[]string{"sagas", "retry", "--filter", "status=NOPE", "--reason", "r"}, []string{"--filter", `status "NOPE"`}},
		{[]string{"sagas", "cancel", "--filter", "created_after=2026-02-01T00:00:00Z,created_before=2026-01-01T00:00:00Z", "--reason", "r"}, []string{"created_after"}},
	}
	for _, tc := range cases {
		opts := &rootOptions{}
		var stderr bytes.Buffer
		code := execute(context.Background(), newRootCmd(opts), opts, append(tc.args, "--database-url", db), &stderr)
		oneLineNaming(t, strings.Join(tc.args, " "), code, stderr.String(), tc.want...)
		if strings.Contains(stderr.String(), "cannot reach") {
			t.Errorf("%v: connected before checking the value: %q", tc.args, stderr.String())
		}
	}
}

func TestVersionComesFromTheBuildInfo(t *testing.T) {
	line := versionLine()
	if !strings.HasPrefix(line, "relay ") || !strings.Contains(line, " commit ") || !strings.Contains(line, "go1.") {
		t.Fatalf("version line %q lacks the module version, commit or Go version", line)
	}
}
