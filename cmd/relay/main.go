// Command relay is Compensa's sidecar: it streams committed outbox inserts out
// of PostgreSQL's write-ahead log, starts saga instances exactly once and runs
// their steps. See README.md for the commands and flags.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:]))
}

// run executes the CLI and returns the process exit code. Errors are printed
// as one line on stderr, with any password removed.
func run(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	opts := &rootOptions{}
	root := newRootCmd(opts)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	code, msg := 1, err.Error()
	var ee exitError
	if errors.As(err, &ee) {
		code, msg = ee.code, ee.msg
	}
	if msg != "" {
		fmt.Fprintln(os.Stderr, "relay: "+termSafe(oneLine(redactAll(msg, opts.secrets()))))
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
			return opts.resolve(cmd)
		},
	}
	opts.bind(root)
	root.AddCommand(
		newVersionCmd(),
		newMigrateCmd(opts),
	)
	for _, extra := range extraCommands {
		root.AddCommand(extra(opts))
	}
	return root
}

// extraCommands lets each command live in its own file (run.go, lag.go, ...)
// and register itself from an init function.
var extraCommands []func(*rootOptions) *cobra.Command

func registerCommand(f func(*rootOptions) *cobra.Command) {
	extraCommands = append(extraCommands, f)
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the relay's version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), "relay", version)
			return nil
		},
	}
}

func newLogger(opts *rootOptions) *slog.Logger {
	level := slog.LevelInfo
	_ = level.UnmarshalText([]byte(opts.logLevel))
	h := slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})
	return slog.New(&redactingHandler{Handler: h, secret: opts.secrets()})
}
