package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/sink/dial"
)

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
			for _, w := range cfg.Warnings() {
				fmt.Fprintf(cmd.ErrOrStderr(), "%s:%d: warning: %s\n", args[0], w.Line, w)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %d sinks, valid\n", args[0], len(cfg.Sinks))
			return nil
		},
	}
	var asJSON bool
	list := &cobra.Command{
		Use:   "list",
		Short: "Per sink: state, delivered, filtered, parked, age of the oldest parked event",
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
			fmt.Fprintln(tw, "NAME\tKIND\tSTATE\tDELIVERED\tFILTERED\tPARKED\tOLDEST PARKED\tREASON\tLAST REASON")
			for _, s := range st {
				age := "-"
				if s.OldestParkedSeconds != nil {
					age = strconv.FormatFloat(*s.OldestParkedSeconds, 'f', 0, 64) + "s"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\n", s.Name, s.Kind, s.State, s.Delivered, s.Filtered, s.Parked, age,
					dash(terminalSafe(s.Reason)), dash(terminalSafe(s.LastReason)))
			}
			return tw.Flush()
		},
	}
	opts.bindTo(list.Flags(), "database-url")
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
	opts.bindTo(retry.Flags(), "database-url")
	cmd.AddCommand(validate, list, retry, newSinksParkedCmd(opts), newSinksSkipCmd(opts), newSinksReplayCmd(opts))
	cmd.AddCommand(newSinksTestCmd(opts))
	return cmd
}

// newSinksReplayCmd is `relay sinks replay NAME`: re-deliver the outbox rows
// still in the table to one sink of a sinks file, beside the running relay.
func newSinksReplayCmd(opts *rootOptions) *cobra.Command {
	var since, until, aggType, eventType, file string
	var dryRun, asJSON, includeSkipped bool
	cmd := &cobra.Command{
		Use:   "replay NAME --since TIME",
		Short: "Re-deliver the outbox rows still in the table to one sink (original ids, in order per aggregate)",
		Long: "Reads the outbox rows created from --since (inclusive) to --until (exclusive; default now) that\n" +
			"the sink's match and --aggregate-type / --event-type select, in created_at order (then id), and\n" +
			"delivers them to the sink named NAME in --sinks FILE with their original ids (the brokers' and\n" +
			"endpoints' dedupe ids). It runs beside the relay and never holds its stream. --dry-run only counts.\n" +
			"Events an operator skipped for the sink are left out unless --include-skipped; one replay of a\n" +
			"sink runs at a time (across relays and this command).\n" +
			"Events written as logical decoding messages (pg_logical_emit_message, outbox.Emit) are not in the\n" +
			"table and cannot be replayed: the WAL that held them is gone once the slot passed them. Write\n" +
			"events you may need to replay as outbox rows, or re-emit them from a store of your own.\n" +
			"TIME is RFC 3339 (2026-01-02T15:04:05Z) or a date (2026-01-02, UTC).",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := sink.ReplayRequest{AggregateType: aggType, EventType: eventType, DryRun: dryRun, IncludeSkipped: includeSkipped}
			var err error
			if since == "" {
				return exitError{code: 2, msg: "--since is required: give the start of the window, e.g. --since 2026-01-02T15:04:05Z"}
			}
			if req.Since, err = parseTime("--since", since); err != nil {
				return exitError{code: 2, msg: err.Error()}
			}
			if until != "" {
				if req.Until, err = parseTime("--until", until); err != nil {
					return exitError{code: 2, msg: err.Error()}
				}
			}
			if file == "" {
				return exitError{code: 2, msg: "--sinks FILE is required: the sinks file the relay runs with (env RELAY_SINKS)"}
			}
			if req.Table, err = outbox.ParseTableName(opts.OutboxTable); err != nil {
				return exitError{code: 2, msg: err.Error()}
			}
			if req.Columns, err = outbox.ParseColumnMap(opts.OutboxColumns); err != nil {
				return exitError{code: 2, msg: err.Error()}
			}
			cfg, err := sink.LoadFile(file)
			if err != nil {
				return exitError{code: 2, msg: err.Error()}
			}
			var spec *sink.Spec
			for i := range cfg.Sinks {
				if cfg.Sinks[i].Name == args[0] {
					spec = &cfg.Sinks[i]
				}
			}
			if spec == nil {
				return exitError{code: 2, msg: fmt.Sprintf("no sink named %q in %s", args[0], file)}
			}
			cfg.Sinks = []sink.Spec{*spec}
			var dests []sink.Destination
			if !dryRun {
				if dests, err = dial.Open(cfg, nil); err != nil {
					return exitError{code: 2, msg: err.Error()}
				}
				defer dial.Close(dests)
			} else {
				dests = []sink.Destination{{Spec: *spec}}
			}
			pool, err := openPool(cmd.Context(), opts, 2)
			if err != nil {
				return err
			}
			defer pool.Close()
			res, err := sink.Replay(cmd.Context(), pool, dests[0], req)
			out := cmd.OutOrStdout()
			if asJSON {
				json.NewEncoder(out).Encode(res)
			} else if dryRun {
				fmt.Fprintf(out, "sink %s: %d rows found (dry run: nothing delivered)\n", res.Sink, res.Found)
			} else {
				fmt.Fprintf(out, "sink %s: %d rows found, %d delivered\n", res.Sink, res.Found, res.Delivered)
			}
			if !asJSON && res.Skipped > 0 {
				fmt.Fprintf(out, "sink %s: %d skipped events left out (--include-skipped delivers them too)\n", res.Sink, res.Skipped)
			}
			return err
		},
	}
	opts.bindTo(cmd.Flags(), "database-url", "outbox-table", "outbox-columns")
	f := cmd.Flags()
	f.StringVar(&since, "since", "", "start of the window (created_at, inclusive; required): RFC 3339 or a date (UTC)")
	f.StringVar(&until, "until", "", "end of the window (created_at, exclusive; default now)")
	f.StringVar(&aggType, "aggregate-type", "", "only this aggregate type")
	f.StringVar(&eventType, "event-type", "", "only event types matching this glob, e.g. 'order.*'")
	f.BoolVar(&dryRun, "dry-run", false, "only count the rows")
	f.BoolVar(&includeSkipped, "include-skipped", false, "deliver the events an operator skipped for this sink too")
	f.StringVar(&file, "sinks", "", "the sinks file the relay runs with (required; the sink's own match applies too) (env RELAY_SINKS)")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// parseTime reads RFC 3339 or a date (UTC).
func parseTime(flag, s string) (time.Time, error) {
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%s %q: give a time in RFC 3339 (2026-01-02T15:04:05Z) or a date (2026-01-02)", flag, s)
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
