package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/outbox"
)

// newLagCmd is `relay lag`: the slot's replication lag, read with read-only
// queries, so that it works from another shell while the relay runs.
func newLagCmd(opts *rootOptions) *cobra.Command {
	var (
		follow   bool
		asJSON   bool
		interval time.Duration
	)
	cmd := &cobra.Command{
		Use:   "lag",
		Short: "Print the replication lag of the relay's slot (read-only)",
		Long: "Prints the slot, whether a relay streams it (active), its wal_status, the lag in bytes\n" +
			"(pg_current_wal_lsn() - confirmed_flush_lsn, human and exact) and in seconds (the age of the\n" +
			"oldest outbox row the relay has not handled yet: 0 when it is caught up).\n" +
			"--json prints one object per line with the keys slot, active, wal_status, lag_bytes,\n" +
			"lag_seconds, confirmed_flush_lsn, current_lsn, failover (the slot's failover flag, PostgreSQL 17+),\n" +
			"synchronized_standby_slots (the primary's setting) and failover_ready (the slot would survive\n" +
			"a promotion now). --follow prints one line per --interval.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if interval <= 0 {
				return fmt.Errorf("--interval must be positive, got %s", interval)
			}
			table, err := outbox.ParseTableName(opts.OutboxTable)
			if err != nil {
				return usageError("%v", err)
			}
			cols, err := outbox.ParseColumnMap(opts.OutboxColumns)
			if err != nil {
				return usageError("%v", err)
			}
			ctx := cmd.Context()
			pool, err := openPool(ctx, opts, 1)
			if err != nil {
				return err
			}
			defer pool.Close()
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for {
				rep, err := cdc.QueryLagOf(ctx, pool, opts.Slot, table, cols["created_at"])
				switch {
				case err != nil && ctx.Err() != nil:
					return nil
				case err != nil && !follow:
					return err
				case err != nil:
					// Following through a restart or a missing slot: say so
					// and keep going.
					fmt.Fprintln(cmd.ErrOrStderr(), "relay lag: "+redactAll(err.Error(), opts.secrets()))
				default:
					if werr := cdc.WriteLag(cmd.OutOrStdout(), rep, asJSON); werr != nil {
						return werr
					}
				}
				if !follow {
					return nil
				}
				select {
				case <-ctx.Done():
					return nil
				case <-tick.C:
				}
			}
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&follow, "follow", "f", false, "print one line per --interval until interrupted")
	f.DurationVar(&interval, "interval", 2*time.Second, "time between lines with --follow")
	f.BoolVar(&asJSON, "json", false, "print one JSON object per line")
	return cmd
}
