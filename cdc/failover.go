package cdc

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrReadOnly: the database URL led to a standby (a server in recovery).
// Run does not stream from it: it waits and retries, so that a URL naming
// every host of a cluster with target_session_attrs=read-write finds the
// primary again after a promotion.
var ErrReadOnly = errors.New("connected to a standby (read-only)")

// failoverMajor is the first PostgreSQL version whose logical slots can be
// synchronized to standbys and survive a promotion.
const failoverMajor = 17

const sqlInRecovery = `SELECT pg_is_in_recovery(), current_setting('server_version_num')::int / 10000`

// checkPrimary returns ErrReadOnly when pool's server is a standby, and the
// server's major version otherwise.
func checkPrimary(ctx context.Context, q Querier) (int, error) {
	var recovery bool
	var major int
	if err := q.QueryRow(ctx, sqlInRecovery).Scan(&recovery, &major); err != nil {
		return 0, fmt.Errorf("cdc: read the server's role: %w", err)
	}
	if recovery {
		return major, errorf(ErrReadOnly, "the database URL leads to a standby (read-only): waiting for a primary; name every host of the cluster with target_session_attrs=read-write so that the relay finds the primary by itself")
	}
	return major, nil
}

// FailoverReport says whether the slot can survive a promotion of a
// standby (PostgreSQL 17 and later).
type FailoverReport struct {
	// Failover is the slot's failover flag (always false before 17).
	Failover bool
	// SynchronizedStandbySlots is the primary's synchronized_standby_slots
	// setting ("" when unset or before 17).
	SynchronizedStandbySlots string
	// Ready: the slot has failover on, and every physical slot named in
	// synchronized_standby_slots exists and has a standby connected.
	Ready bool
	// Missing names, for people, each setting that keeps Ready false, on
	// the primary or, where the primary can see them, on the standbys.
	Missing []string
}

const sqlFailover = `
SELECT s.failover, current_setting('synchronized_standby_slots')
FROM pg_replication_slots s WHERE s.slot_name = $1`

// sqlStandbys lists the physical slots named in synchronized_standby_slots
// with their state, and the standbys streaming without a slot.
const sqlStandbys = `
SELECT n.name, p.slot_type IS NOT NULL, coalesce(p.slot_type = 'physical', false),
       coalesce(p.active, false), p.xmin IS NOT NULL
FROM unnest(string_to_array(nullif(current_setting('synchronized_standby_slots'), ''), ',')) AS u(raw),
     LATERAL (SELECT trim(u.raw) AS name) n
LEFT JOIN pg_replication_slots p ON p.slot_name = n.name`

const sqlSlotlessStandbys = `
SELECT coalesce(string_agg(r.application_name, ', '), ''), count(*)
FROM pg_stat_replication r
WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots p WHERE p.active_pid = r.pid)`

// The slot synchronization worker of a standby connects to the primary as
// an ordinary session named "slotsync worker" (after cluster_name, when set).
const sqlSlotSyncWorkers = `
SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE '%slotsync worker'`

// QueryFailover reads whether the slot can survive a promotion. Before
// PostgreSQL 17 it reports Ready false with the version as the reason.
func QueryFailover(ctx context.Context, q Querier, slot string) (FailoverReport, error) {
	var r FailoverReport
	var major int
	if err := q.QueryRow(ctx, `SELECT current_setting('server_version_num')::int / 10000`).Scan(&major); err != nil {
		return r, fmt.Errorf("cdc: read the server version: %w", err)
	}
	if major < failoverMajor {
		r.Missing = []string{fmt.Sprintf("PostgreSQL %d has no failover slots (17 and later have): a promotion loses the slot; see --on-slot-lost=resync", major)}
		return r, nil
	}
	err := q.QueryRow(ctx, sqlFailover, slot).Scan(&r.Failover, &r.SynchronizedStandbySlots)
	if err != nil {
		return r, fmt.Errorf("cdc: read the failover state of slot %q: %w", slot, err)
	}
	if !r.Failover {
		r.Missing = append(r.Missing, fmt.Sprintf("slot %q has failover off (the relay turns it on at start)", slot))
	}
	if strings.TrimSpace(r.SynchronizedStandbySlots) == "" {
		r.Missing = append(r.Missing, "synchronized_standby_slots is empty on the primary: name the physical slot of each standby that may be promoted")
	}
	rows, err := q.Query(ctx, sqlStandbys)
	if err != nil {
		return r, fmt.Errorf("cdc: read the standby slots: %w", err)
	}
	connected := 0
	var name string
	var exists, physical, active, feedback bool
	if _, err := pgx.ForEachRow(rows, []any{&name, &exists, &physical, &active, &feedback}, func() error {
		switch {
		case !exists:
			r.Missing = append(r.Missing, fmt.Sprintf("synchronized_standby_slots names %q, which does not exist: create it (pg_create_physical_replication_slot) and set primary_slot_name on the standby", name))
		case !physical:
			r.Missing = append(r.Missing, fmt.Sprintf("synchronized_standby_slots names %q, which is not a physical slot", name))
		case !active:
			r.Missing = append(r.Missing, fmt.Sprintf("no standby streams from slot %q: check primary_slot_name and primary_conninfo on the standby", name))
		case !feedback:
			connected++
			r.Missing = append(r.Missing, fmt.Sprintf("the standby on slot %q sends no feedback: set hot_standby_feedback = on on it", name))
		default:
			connected++
		}
		return nil
	}); err != nil {
		return r, fmt.Errorf("cdc: read the standby slots: %w", err)
	}
	var names string
	var slotless int
	if err := q.QueryRow(ctx, sqlSlotlessStandbys).Scan(&names, &slotless); err == nil && slotless > 0 {
		r.Missing = append(r.Missing, fmt.Sprintf("standby %s streams without a replication slot: set primary_slot_name on it", names))
	}
	var workers int
	if err := q.QueryRow(ctx, sqlSlotSyncWorkers).Scan(&workers); err == nil && connected > 0 && workers == 0 {
		r.Missing = append(r.Missing, "no standby synchronizes slots: set sync_replication_slots = on, hot_standby_feedback = on, and a dbname in primary_conninfo on the standbys")
	}
	r.Ready = r.Failover && len(r.Missing) == 0
	return r, nil
}

// ensureFailover turns failover on for an existing slot on PostgreSQL 17 and
// later (a slot created by an earlier release, or by hand). The slot must
// not be in use: a slot still held by a previous streamer is retried at the
// next session.
func (s *Stream) ensureFailover(ctx context.Context, pool *pgxpool.Pool, major int) {
	if major < failoverMajor {
		return
	}
	var on bool
	if err := pool.QueryRow(ctx, `SELECT failover FROM pg_replication_slots WHERE slot_name = $1`, s.cfg.Slot).Scan(&on); err != nil || on {
		return
	}
	repl, err := s.connectReplication(ctx)
	if err != nil {
		s.log.Warn("cannot turn failover on for the slot", "err", err)
		return
	}
	defer s.closeConn(repl)
	if _, err := repl.Exec(ctx, fmt.Sprintf("ALTER_REPLICATION_SLOT %s (FAILOVER true)", s.cfg.Slot)).ReadAll(); err != nil {
		s.log.Warn("cannot turn failover on for the slot: it will not survive a promotion", "err", err)
		return
	}
	s.log.Info("turned failover on for the slot: it is synchronized to standbys with sync_replication_slots")
}

// warnFailover logs once per session what keeps the slot from surviving a
// promotion.
func (s *Stream) warnFailover(ctx context.Context, pool *pgxpool.Pool, major int) {
	if major < failoverMajor {
		return
	}
	r, err := QueryFailover(ctx, pool, s.cfg.Slot)
	if err != nil {
		s.log.Warn("cannot read whether the slot survives a promotion", "err", err)
		return
	}
	if !r.Ready {
		s.log.Warn("the slot will not survive a promotion of a standby until these are set", "missing", strings.Join(r.Missing, "; "),
			"synchronized_standby_slots", r.SynchronizedStandbySlots)
	}
}

// createSlot creates the slot with an exported snapshot, as a failover slot
// on PostgreSQL 17 and later.
func (s *Stream) createSlot(ctx context.Context, repl *pgconn.PgConn) (pglogrepl.CreateReplicationSlotResult, error) {
	if serverMajor(repl) >= failoverMajor {
		sql := fmt.Sprintf("CREATE_REPLICATION_SLOT %s LOGICAL pgoutput (SNAPSHOT 'export', FAILOVER true)", s.cfg.Slot)
		return pglogrepl.ParseCreateReplicationSlot(repl.Exec(ctx, sql))
	}
	return pglogrepl.CreateReplicationSlot(ctx, repl, s.cfg.Slot, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: "EXPORT_SNAPSHOT"})
}
