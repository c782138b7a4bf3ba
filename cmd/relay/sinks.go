package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/compensa/compensa/sink"
)

func init() { registerCommand(newSinksCmd) }

// newSinksCmd is `relay sinks`: check a sinks file, and see and re-drive
// each sink's deliveries (against the database; no relay needs to run).
func newSinksCmd(opts *rootOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sinks",
		Short: "Validate a sinks file; list sinks and re-drive their parked events",
	}
	validate := &cobra.Command{
		Use:   "validate FILE",
		Short: "Check a sinks file without a database: every problem as file:line:col, exit 2 if any",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := sink.LoadFile(args[0])
			var ce *sink.ConfigError
			if errors.As(err, &ce) {
				// One problem per line (the editor-friendly form); the
				// closing line is the one-line summary every error gets.
				for _, p := range ce.Problems {
					fmt.Fprintln(cmd.ErrOrStderr(), terminalSafe(p.String()))
				}
				return exitError{code: 2, msg: fmt.Sprintf("%s: %d problems; fix them and run relay sinks validate again", args[0], len(ce.Problems))}
			}
			if err != nil {
				return exitError{code: 2, msg: err.Error()}
			}
			for _, s := range cfg.Sinks {
				fmt.Fprintf(cmd.OutOrStdout(), "%s: %s sink %q\n", args[0], s.Kind(), s.Name)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %d sinks, valid\n", args[0], len(cfg.Sinks))
			return nil
		},
	}
	var asJSON bool
	list := &cobra.Command{
		Use:   "list",
		Short: "Per sink: state, delivered, parked, age of the oldest parked event",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, err := openPool(cmd.Context(), opts, 2)
			if err != nil {
				return err
			}
			defer pool.Close()
			st, err := sink.List(cmd.Context(), pool)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(map[string]any{"sinks": st})
			}
			if len(st) == 0 {
				fmt.Fprintln(out, "no sinks (start the relay with --sinks FILE)")
				return nil
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tKIND\tSTATE\tDELIVERED\tPARKED\tOLDEST PARKED\tREASON\tLAST REASON")
			for _, s := range st {
				age := "-"
				if s.OldestParkedSeconds != nil {
					age = strconv.FormatFloat(*s.OldestParkedSeconds, 'f', 0, 64) + "s"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", s.Name, s.Kind, s.State, s.Delivered, s.Parked, age,
					dash(terminalSafe(s.Reason)), dash(terminalSafe(s.LastReason)))
			}
			return tw.Flush()
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	retry := &cobra.Command{
		Use:   "retry NAME",
		Short: "Re-drive the sink's parked events now (and re-enable a sink disabled by 410)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pool, err := openPool(cmd.Context(), opts, 2)
			if err != nil {
				return err
			}
			defer pool.Close()
			n, err := sink.RequestRetry(cmd.Context(), pool, args[0])
			if errors.Is(err, sink.ErrUnknownSink) {
				return exitError{code: 2, msg: err.Error()}
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "sink %s: %d parked events due now; the running relay probes it and drains them in order\n", args[0], n)
			return nil
		},
	}
	cmd.AddCommand(validate, list, retry, newSinksParkedCmd(opts), newSinksSkipCmd(opts))
	return cmd
}

// terminalSafe keeps control characters of a stored reason off the terminal.
func terminalSafe(s string) string {
	b := []rune(s)
	for i, r := range b {
		if r < ' ' || r == 0x7f {
			b[i] = '?'
		}
	}
	return string(b)
}
