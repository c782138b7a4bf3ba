package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/compensa/compensa/internal/cliflag"
	"github.com/compensa/compensa/sink"
)

// newSinksParkedCmd is `relay sinks parked NAME`: the events parked for a
// sink, in the order they will be delivered, with why each waits.
func newSinksParkedCmd(opts *rootOptions) *cobra.Command {
	var (
		asJSON bool
		limit  int
	)
	cmd := &cobra.Command{
		Use:   "parked NAME",
		Short: "List the events parked for a sink, in delivery order: reason, attempts, age",
		Long: "Lists the events parked for the sink in the order the relay delivers them (commit\n" +
			"order, so each aggregate's oldest first). HEAD marks the first event of its aggregate:\n" +
			"the one being attempted, which the aggregate's later events wait behind. An event the\n" +
			"destination will never accept can be given up with `relay sinks skip`.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pool, err := openPool(cmd.Context(), opts, 2)
			if err != nil {
				return err
			}
			defer pool.Close()
			evs, err := sink.ListParked(cmd.Context(), pool, args[0], sink.ParkedFilter{Limit: limit})
			if errors.Is(err, sink.ErrUnknownSink) {
				return exitError{code: 2, msg: err.Error()}
			}
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(map[string]any{"sink": args[0], "items": evs})
			}
			if len(evs) == 0 {
				fmt.Fprintf(out, "nothing parked for sink %s\n", args[0])
				return nil
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "EVENT ID\tAGGREGATE\tEVENT TYPE\tHEAD\tATTEMPTS\tAGE\tNEXT ATTEMPT\tREASON")
			for _, e := range evs {
				head, next := "", "-"
				if e.Head {
					head = "yes"
					next = "held: relay sinks retry"
					if e.NextAttemptAt != nil {
						next = e.NextAttemptAt.UTC().Format(time.RFC3339)
					}
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", terminalSafe(e.EventID),
					terminalSafe(e.AggregateType+"/"+e.AggregateID), terminalSafe(e.EventType), head, e.Attempts,
					strconv.FormatFloat(e.AgeSeconds, 'f', 0, 64)+"s", next, terminalSafe(e.Reason))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if len(evs) == limit {
				fmt.Fprintf(out, "(the first %d; --limit shows more)\n", limit)
			}
			return nil
		},
	}
	opts.bindTo(cmd.Flags(), "database-url")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON, as GET /v1/sinks/{name}/parked answers")
	cmd.Flags().Var(cliflag.IntBetween(&limit, sink.DefaultParkedLimit, 1, sink.MaxParkedLimit), "limit", fmt.Sprintf("how many to show (1 to %d)", sink.MaxParkedLimit))
	return cmd
}

// newSinksSkipCmd is `relay sinks skip NAME --id ID --reason TEXT`.
func newSinksSkipCmd(opts *rootOptions) *cobra.Command {
	var id, reason, actor string
	cmd := &cobra.Command{
		Use:   "skip NAME --id ID --reason TEXT",
		Short: "Give up on one parked event the destination will never accept; its aggregate's later events flow again",
		Long: "Moves one parked event of the sink into relay_sink_skipped, with who skipped it\n" +
			"(--actor, default cli:<your user name>, and the database role), when and why, in one\n" +
			"transaction: it is never delivered, and never simply deleted. The later events of its\n" +
			"aggregate are then delivered in order by the running relay.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case id == "":
				return usageError("--id is required: the event id `relay sinks parked %s` shows", args[0])
			case reason == "":
				return usageError("--reason is required: say why this event can never be delivered (it is kept with your name)")
			}
			if actor == "" {
				actor = cliActor()
			}
			pool, err := openPool(cmd.Context(), opts, 2)
			if err != nil {
				return err
			}
			defer pool.Close()
			s, err := sink.Skip(cmd.Context(), pool, sink.SkipRequest{Sink: args[0], EventID: id, Reason: reason, Actor: actor})
			if errors.Is(err, sink.ErrUnknownSink) || errors.Is(err, sink.ErrNotParked) || errors.Is(err, sink.ErrInvalid) {
				return exitError{code: 2, msg: err.Error()}
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "sink %s: event %s (%s/%s %s, %d attempts, last: %s) skipped by %s as role %s; kept in relay_sink_skipped; the later events of its aggregate flow again\n",
				s.Sink, terminalSafe(s.EventID), terminalSafe(s.AggregateType), terminalSafe(s.AggregateID), terminalSafe(s.EventType),
				s.Attempts, terminalSafe(s.Reason), s.SkippedBy, s.SkippedRole)
			return nil
		},
	}
	opts.bindTo(cmd.Flags(), "database-url")
	cmd.Flags().StringVar(&id, "id", "", "the parked event's id (required; see relay sinks parked)")
	cmd.Flags().StringVar(&reason, "reason", "", "why it can never be delivered (required; kept with the event)")
	cmd.Flags().StringVar(&actor, "actor", "", "who skips it, as kept in relay_sink_skipped with the database role (default cli:<OS user>)")
	return cmd
}

// dash stands for an empty cell of a table.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
