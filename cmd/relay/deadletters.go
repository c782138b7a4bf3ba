package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"text/tabwriter"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/correlator"
	"github.com/compensa/compensa/internal/cliflag"
	"github.com/compensa/compensa/outbox"
)

func newDeadLettersCmd(opts *rootOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "deadletters",
		Aliases: []string{"dead-letters"},
		Short:   "List and re-drive events the relay parked because it could not use them",
	}
	var (
		all        bool
		limit      int
		asJSON     bool
		fromOutbox bool
	)
	list := &cobra.Command{
		Use:   "list",
		Short: "List parked events, newest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			corr, pool, err := openCorrelator(ctx, opts)
			if err != nil {
				return err
			}
			defer pool.Close()
			items, err := corr.ListDeadLetters(ctx, !all, limit)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				for _, d := range items {
					if err := enc.Encode(d); err != nil {
						return err
					}
				}
				return nil
			}
			if len(items) == 0 {
				fmt.Fprintln(out, "no parked events")
				return nil
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tPARKED AT\tLSN\tEVENT TYPE\tEVENT ID\tRETRIES\tREASON")
			for _, d := range items {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\n", d.ID, d.ParkedAt.UTC().Format("2006-01-02 15:04:05"),
					d.LSN, d.EventType, d.EventID, d.RetryCount, d.Reason)
			}
			return tw.Flush()
		},
	}
	opts.bindTo(list.Flags(), "database-url")
	list.Flags().BoolVar(&all, "all", false, "include events already re-driven")
	list.Flags().Var(cliflag.IntBetween(&limit, 100, 1, correlator.MaxDeadLetterLimit), "limit", fmt.Sprintf("how many to show (1 to %d)", correlator.MaxDeadLetterLimit))
	list.Flags().BoolVar(&asJSON, "json", false, "one JSON object per line")

	retry := &cobra.Command{
		Use:   "retry ID",
		Short: "Re-drive a parked event once its cause is fixed",
		Long: "Runs the parked event through routing and validation again, as if it had just\n" +
			"been streamed: by default the whole event stored when it was parked (tenant, headers,\n" +
			"correlation and causation ids included); with --from-outbox the event's current\n" +
			"outbox row (read from --outbox-table by id) when it still exists; the output says\n" +
			"which. A saga it triggers starts at most once (the unique index on\n" +
			"(saga_name, saga_version, trigger_event_id) absorbs repeats). An event that is\n" +
			"still unusable stays parked with its new reason, and the command exits 1.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil || id <= 0 {
				return usageError("dead letter id %q is not a positive number (see `relay deadletters list`)", args[0])
			}
			ctx := cmd.Context()
			corr, pool, err := openCorrelator(ctx, opts)
			if err != nil {
				return err
			}
			defer pool.Close()
			var d correlator.DeadLetter
			if fromOutbox {
				table, terr := outbox.ParseTableName(opts.OutboxTable)
				if terr != nil {
					return exitError{code: 2, msg: "--outbox-table: " + terr.Error()}
				}
				cols, cerr := outbox.ParseColumnMap(opts.OutboxColumns)
				if cerr != nil {
					return exitError{code: 2, msg: cerr.Error()}
				}
				d, err = corr.RetryDeadLetterFromOutbox(ctx, id, func(ctx context.Context, q cdc.Querier, rawID string) (outbox.Event, bool, error) {
					return cdc.ReadEvent(ctx, q, table, cols, rawID)
				})
			} else {
				d, err = corr.RetryDeadLetter(ctx, id)
			}
			if errors.Is(err, correlator.ErrStillPoison) {
				return exitError{code: 1, msg: fmt.Sprintf("dead letter %d is still unusable (re-driven from %s): %s", id, d.RedrivenFrom, d.Reason)}
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "dead letter %d re-driven from %s (event %s, %s)\n", d.ID, d.RedrivenFrom, d.EventID, d.EventType)
			return nil
		},
	}
	opts.bindTo(retry.Flags(), "database-url", "outbox-table", "outbox-columns")
	retry.Flags().BoolVar(&fromOutbox, "from-outbox", false, "re-drive the event's current outbox row (when it still exists) instead of the stored copy")
	cmd.AddCommand(list, retry)
	return cmd
}

// openCorrelator opens a small pool and a correlator with the sagas this
// binary knows there, for the commands that read or re-drive dead letters.
// The caller closes the pool.
func openCorrelator(ctx context.Context, opts *rootOptions) (*correlator.Correlator, *pgxpool.Pool, error) {
	pool, err := openPool(ctx, opts, 2)
	if err != nil {
		return nil, nil, err
	}
	reg, err := registryFor(ctx, pool)
	if err == nil {
		var corr *correlator.Correlator
		if corr, err = correlator.New(pool, &correlator.Config{Registry: reg}); err == nil {
			return corr, pool, nil
		}
	}
	pool.Close()
	return nil, nil, err
}
