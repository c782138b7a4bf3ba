package cdc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/compensa/compensa/outbox"
)

// Lag is the stream's own view of how far behind it is, for metrics and the
// monitor. It is kept in memory and costs no query.
type Lag struct {
	Slot   string
	Leader bool
	// Bytes is the newest server WAL position the stream has seen (from the
	// server's messages and from each heartbeat) minus FlushLSN.
	Bytes uint64
	// Seconds is the age, by this machine's clock, of the oldest committed
	// transaction the stream has received and the sink has not yet
	// committed: 0 when the stream is caught up, however long ago the last
	// commit was; it grows while the sink is stuck on a transaction.
	Seconds float64
	// LastCommit is the source commit time of the newest transaction or
	// heartbeat the sink committed.
	LastCommit time.Time
	// FlushLSN is the position last reported to PostgreSQL as flushed.
	FlushLSN  pglogrepl.LSN
	ServerLSN pglogrepl.LSN
}

// LagReport is the slot's lag as PostgreSQL sees it, read by QueryLag from
// any process (`relay lag`, GET /v1/replication). Its JSON keys are a public
// contract.
type LagReport struct {
	Slot   string `json:"slot"`
	Active bool   `json:"active"`
	// WALStatus is pg_replication_slots.wal_status: reserved, extended,
	// unreserved or lost.
	WALStatus string `json:"wal_status"`
	// LagBytes is pg_current_wal_lsn() − confirmed_flush_lsn: the WAL the
	// relay has not yet confirmed.
	LagBytes int64 `json:"lag_bytes"`
	// LagSeconds is the age of the oldest outbox row committed after the
	// newest transaction the relay handled (the source commit time in
	// relay_checkpoints.updated_at): 0 when the relay is caught up, however
	// long ago it last handled anything; it grows with that row's age while
	// the relay is stopped, stuck or working through a backlog. Nil when the
	// slot has no checkpoint yet, or the outbox table cannot be read.
	LagSeconds        *float64 `json:"lag_seconds"`
	ConfirmedFlushLSN string   `json:"confirmed_flush_lsn"`
	CurrentLSN        string   `json:"current_lsn"`
	// Failover is the slot's failover flag: on PostgreSQL 17 and later a
	// failover slot is synchronized to standbys and survives a promotion.
	// Always false before 17.
	Failover bool `json:"failover"`
	// SynchronizedStandbySlots is the primary's synchronized_standby_slots
	// setting: the physical slots of the standbys a promotion may pick.
	SynchronizedStandbySlots string `json:"synchronized_standby_slots"`
	// FailoverReady: the slot would survive a promotion now (see
	// QueryFailover).
	FailoverReady bool `json:"failover_ready"`
}

const sqlLag = `
SELECT s.active, coalesce(s.wal_status, ''),
       coalesce(s.confirmed_flush_lsn, '0/0')::text, pg_current_wal_lsn()::text,
       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn), 0)::bigint
FROM pg_replication_slots s WHERE s.slot_name = $1`

// sqlLagSeconds finds the oldest outbox row created after the checkpoint's
// source commit time (an index scan on created_at). A row's created_at is
// its transaction's start: a row committed after the checkpoint by a
// transaction that began before it is counted once a later row is, so the
// figure errs low by at most the length of such a transaction.
const sqlLagSeconds = `
SELECT coalesce(extract(epoch FROM clock_timestamp() - (
         SELECT min(o.%[2]s) FROM %[1]s o WHERE o.%[2]s > c.updated_at)), 0)::float8
FROM relay_checkpoints c WHERE c.slot_name = $1`

// QueryLag reads the slot's lag with read-only queries, for the default
// outbox table. A missing slot is an ErrSlotNotFound; a database without
// relay_checkpoints reports no seconds.
func QueryLag(ctx context.Context, q Querier, slot string) (LagReport, error) {
	return QueryLagOf(ctx, q, slot, outbox.TableName{Name: outbox.DefaultTable}, "created_at")
}

// QueryLagOf is QueryLag for an outbox table whose creation time is in the
// column createdAt.
func QueryLagOf(ctx context.Context, q Querier, slot string, table outbox.TableName, createdAt string) (LagReport, error) {
	r := LagReport{Slot: slot}
	err := q.QueryRow(ctx, sqlLag, slot).Scan(&r.Active, &r.WALStatus, &r.ConfirmedFlushLSN, &r.CurrentLSN, &r.LagBytes)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, errorf(ErrSlotNotFound, "replication slot %q does not exist in this cluster: check --slot, or start the relay (or `relay migrate --create-slot`) to create it", slot)
	}
	if err != nil {
		return r, fmt.Errorf("cdc: read the lag of slot %q: %w", slot, err)
	}
	var secs float64
	query := fmt.Sprintf(sqlLagSeconds, table.Quoted(), pgx.Identifier{createdAt}.Sanitize())
	err = q.QueryRow(ctx, query, slot).Scan(&secs)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		secs = max(secs, 0)
		r.LagSeconds = &secs
	case errors.Is(err, pgx.ErrNoRows), errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42703" || pgErr.Code == "42501"):
		// No checkpoint yet, or no outbox table or column this role may
		// read: the age is unknown.
	default:
		return r, fmt.Errorf("cdc: read the checkpoint of slot %q: %w", slot, err)
	}
	f, err := QueryFailover(ctx, q, slot)
	if err != nil {
		return r, err
	}
	r.Failover, r.SynchronizedStandbySlots, r.FailoverReady = f.Failover, f.SynchronizedStandbySlots, f.Ready
	return r, nil
}

// String is the report as one line for people.
func (r LagReport) String() string {
	secs := "unknown (no checkpoint yet)"
	if r.LagSeconds != nil {
		secs = fmt.Sprintf("%.1fs", *r.LagSeconds)
	}
	return fmt.Sprintf("slot %s active=%t wal_status=%s lag=%s (%d bytes) lag_seconds=%s confirmed_flush_lsn=%s current_lsn=%s failover=%t synchronized_standby_slots=%q failover_ready=%t",
		r.Slot, r.Active, r.WALStatus, HumanBytes(r.LagBytes), r.LagBytes, secs, r.ConfirmedFlushLSN, r.CurrentLSN,
		r.Failover, r.SynchronizedStandbySlots, r.FailoverReady)
}

// WriteLag writes the report as a line for people, or as one JSON object on
// one line.
func WriteLag(w io.Writer, r LagReport, asJSON bool) error {
	if !asJSON {
		_, err := fmt.Fprintln(w, r.String())
		return err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// HumanBytes formats n with binary units: 0 B, 512 B, 1.5 KiB, 3.2 GiB.
func HumanBytes(n int64) string {
	const unit = 1024
	if n < unit && n > -unit {
		return fmt.Sprintf("%d B", n)
	}
	f := float64(n)
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	i := -1
	for (f >= unit || f <= -unit) && i < len(units)-1 {
		f /= unit
		i++
	}
	return fmt.Sprintf("%.1f %s", f, units[i])
}
