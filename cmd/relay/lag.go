package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/internal/cliflag"
	"github.com/compensa/compensa/internal/dbconn"
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
			outage := outageNotes{every: interval}
			for {
				rep, err := cdc.QueryLagOf(ctx, pool, opts.Slot, table, cols["created_at"])
				switch {
				case err != nil && ctx.Err() != nil:
					return nil
				case err != nil && !follow:
					return err
				case err != nil:
					// Following through a restart or a missing slot: say so
					// once, and keep going.
					msg := oneLine(dbconn.RedactAll(dbconn.Explain(pool, err).Error(), opts.secrets()))
					kind := lagFailureKind(err, msg)
					var ce *dbconn.ConnectError
					if kind == connectionLost && !errors.As(dbconn.Explain(pool, err), &ce) {
						msg = "lost the connection to PostgreSQL: " + msg
					}
					outage.fail(cmd.ErrOrStderr(), time.Now(), kind, msg)
				default:
					outage.ok(cmd.ErrOrStderr(), time.Now())
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
	opts.bindTo(cmd.Flags(), "database-url", "slot", "outbox-table", "outbox-columns")
	f := cmd.Flags()
	f.BoolVarP(&follow, "follow", "f", false, "print one line per --interval until interrupted")
	f.Var(cliflag.PositiveDuration(&interval, 2*time.Second), "interval", "time between lines with --follow")
	f.BoolVar(&asJSON, "json", false, "print one JSON object per line")
	return cmd
}

// outageNotes says what a follower (relay lag -f) cannot read: a failure
// once, as one line, when it starts or its kind changes; and one line when
// reading works again, with how long it failed. A database that stays down
// does not fill the terminal with the same error every tick.
type outageNotes struct {
	every    time.Duration
	failing  string // the kind of failure said last; "" while reading works
	since    time.Time
	attempts int
}

// connectionLost is the kind of every failure that means "the database
// cannot be reached": the connection dropped, the dial refused, the server
// shutting down or starting up. One outage goes through several of them.
const connectionLost = "connection"

// lagFailureKind sorts a failure: every way of losing the database is one
// kind, any other failure (a missing slot, a refused privilege) is its own.
func lagFailureKind(err error, msg string) string {
	var ce *pgconn.ConnectError
	var ne net.Error
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &ce), errors.As(err, &ne), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF),
		pgconn.SafeToRetry(err), pgconn.Timeout(err):
		return connectionLost
	case errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "08") || strings.HasPrefix(pe.Code, "57P")):
		return connectionLost
	}
	return msg
}

func (o *outageNotes) fail(w io.Writer, now time.Time, kind, msg string) {
	if o.failing == "" {
		o.since, o.attempts = now, 0
	}
	o.attempts++
	if kind == o.failing {
		return
	}
	o.failing = kind
	fmt.Fprintf(w, "relay lag: %s (trying again every %s; said once until it changes)\n", msg, o.every)
}

func (o *outageNotes) ok(w io.Writer, now time.Time) {
	if o.failing == "" {
		return
	}
	fmt.Fprintf(w, "relay lag: reading again after %s (%d failed attempt(s))\n", now.Sub(o.since).Round(time.Second), o.attempts)
	o.failing = ""
}
