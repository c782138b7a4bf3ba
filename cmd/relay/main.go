// Command relay is Compensa's sidecar: it streams committed outbox inserts out
// of PostgreSQL's write-ahead log, starts saga instances exactly once and runs
// their steps. See docs/operations.md and docs/cli/ for the commands and flags.
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/compensa/compensa/internal/dbconn"
	"github.com/compensa/compensa/internal/redact"
)

// version and commit are set at build time with -ldflags "-X main.version=...
// -X main.commit=..." (make build, the Dockerfile); the commit the Go
// toolchain stamps (vcs.revision) wins over commit when there is one.
var (
	version = "dev"
	commit  = ""
)

func main() {
	os.Exit(run(os.Args[1:]))
}

// run executes the CLI and returns the process exit code. Errors are printed
// as one line on stderr, with any password removed.
func run(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	opts := &rootOptions{}
	return execute(ctx, newRootCmd(opts), opts, args, os.Stderr)
}

// execute runs root on args and returns the exit code; errors go to stderr as
// one line.
func execute(ctx context.Context, root *cobra.Command, opts *rootOptions, args []string, stderr io.Writer) int {
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	code, msg := 1, err.Error()
	var ee exitError
	if errors.As(err, &ee) {
		code, msg = ee.code, ee.msg
	} else if errors.Is(err, dbconn.ErrNoDatabase) || errors.Is(err, dbconn.ErrInvalidDSN) {
		// A missing or malformed --database-url is a usage error, whichever
		// command reads it.
		code = 2
	}
	if msg != "" {
		fmt.Fprintln(stderr, "relay: "+termSafe(oneLine(dbconn.RedactAll(msg, opts.secrets()))))
	}
	return code
}

// oneLine folds a multi-line error into one line: an SRE greps for it.
func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ; ")), " ")
}

// exitError carries a specific exit code.
type exitError struct {
	code int
	msg  string
}

func (e exitError) Error() string { return e.msg }

func newRootCmd(opts *rootOptions) *cobra.Command {
	root := &cobra.Command{
		Use:           "relay",
		Short:         "Compensa: transactional-outbox relay and saga correlator for PostgreSQL",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			// Whatever a command prints from the database reaches a
			// terminal: see terminal.go.
			cmd.SetOut(newTermWriter(cmd.OutOrStdout()))
			if err := opts.resolve(cmd); err != nil {
				return exitError{code: 2, msg: err.Error()}
			}
			return nil
		},
	}
	// The command tree, each command in a file of its own.
	root.AddCommand(
		newVersionCmd(),
		newMigrateCmd(opts),
		newRunCmd(opts),
		newLagCmd(opts),
		newSagasCmd(opts),
		newSinksCmd(opts),
		newDeadLettersCmd(opts),
		newDemoCmd(opts),
	)
	harden(root)
	return root
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the relay's version, commit and Go version (from the build info)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), versionLine())
			return nil
		},
	}
}

// versionLine reads the module version, the VCS commit and the Go version
// from the build info the Go toolchain embeds, so that any build (go install,
// go build in a checkout, a release) says what it is. -ldflags -X
// main.version=... overrides the module version, and -X main.commit=... gives
// the commit where the toolchain stamped none (-buildvcs=false, no .git).
func versionLine() string {
	mod, stamped, goVersion := version, cmp.Or(commit, "unknown"), runtime.Version()
	if bi, ok := debug.ReadBuildInfo(); ok {
		if mod == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			mod = bi.Main.Version
		}
		goVersion = bi.GoVersion
		var rev, modified string
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
		if rev != "" {
			stamped = rev
			if modified == "true" {
				stamped += " (modified)"
			}
		}
	}
	return fmt.Sprintf("relay %s commit %s %s", mod, stamped, goVersion)
}

func newLogger(opts *rootOptions) *slog.Logger {
	level := slog.LevelInfo
	_ = level.UnmarshalText([]byte(opts.logLevel))
	h := slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})
	var hide func(string) string
	if secrets := opts.secrets(); len(secrets) > 0 {
		hide = func(s string) string { return dbconn.RedactAll(s, secrets) }
	}
	return slog.New(redact.Handler(h, hide))
}
