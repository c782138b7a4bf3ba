package pgjournal_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/admin"
	"github.com/compensa/compensa/saga/pgjournal"
)

// retentionFixture writes an instance that ended (or not) `ended` ago with
// three step records, three journal events and a delivered reply in the
// inbox, as a finished three-step saga leaves them.
func retentionFixture(t *testing.T, b bundle, status saga.Status, ended time.Duration, stone bool) uuid.UUID {
	t.Helper()
	id := uuid.New()
	var completed *time.Time
	if status != saga.StatusRunning {
		at := time.Now().Add(-ended)
		completed = &at
	}
	var deleted *time.Time
	if stone {
		deleted = completed
	}
	_, err := b.db.Pool.Exec(ctx, `
WITH i AS (
	INSERT INTO saga_instances (id, tenant_id, saga_name, saga_version, status, trigger_event_id, context,
		last_error, created_at, completed_at, history_deleted_at)
	VALUES ($1, $2, 'kept', 1, $3::saga_status, gen_random_uuid(), '{"order_id": "o-1", "note": "a context of some size"}',
		'boom', coalesce($4, now()) - interval '1 second', $4, $5)
	RETURNING id
), s AS (
	INSERT INTO saga_steps (saga_instance_id, step_name, sequence, status, output)
	SELECT i.id, 'step' || n, n, 'COMPLETED', '{"ok": true}' FROM i, generate_series(0, 2) n WHERE NOT $6
), e AS (
	INSERT INTO saga_events (instance_id, version, kind, step, payload, xid)
	SELECT i.id, n, 'step_completed', n, '{"kind": "step_completed"}', pg_current_xact_id() FROM i, generate_series(1, 3) n WHERE NOT $6
)
INSERT INTO relay_inbox (consumer, event_id, instance_id, outcome)
SELECT 'correlator', gen_random_uuid(), i.id, 'delivered' FROM i WHERE NOT $6`,
		id, uuid.New(), string(status), completed, deleted, stone)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func children(t *testing.T, b bundle, id uuid.UUID) (steps, events, inbox int) {
	t.Helper()
	err := b.db.Pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM saga_steps WHERE saga_instance_id = $1),
		(SELECT count(*) FROM saga_events WHERE instance_id = $1),
		(SELECT count(*) FROM relay_inbox WHERE instance_id = $1)`, id).Scan(&steps, &events, &inbox)
	if err != nil {
		t.Fatal(err)
	}
	return
}

// TestRetentionKeepsTheGuardAndDeletesTheHistory: one round tombstones the
// instances that ended COMPLETED or COMPENSATED longer ago than History
// (their steps, events and inbox rows gone; the row with its trigger kept,
// its context and error cleared), keeps RUNNING, FAILED and recently ended
// ones whole, deletes tombstones past the dedupe window (except those a
// resync of the slot could still re-read), deletes re-driven dead letters
// and skipped deliveries past History and keeps the others, and leaves the
// status counts equal to what the table holds, with the deltas folded.
func TestRetentionKeepsTheGuardAndDeletesTheHistory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := time.Hour
	done := retentionFixture(t, b, saga.StatusCompleted, old, false)
	undone := retentionFixture(t, b, saga.StatusCompensated, old, false)
	recent := retentionFixture(t, b, saga.StatusCompleted, time.Second, false)
	running := retentionFixture(t, b, saga.StatusRunning, 0, false)
	failed := retentionFixture(t, b, saga.StatusFailed, old, false)
	expired := retentionFixture(t, b, saga.StatusCompleted, 40*24*time.Hour, true)
	_, err := b.db.Pool.Exec(ctx, `
INSERT INTO relay_dead_letters (event_id, lsn, reason, raw, parked_at, retried_at) VALUES
	('redriven', '0/1', 'bad', '{}', now() - interval '3 hours', now() - interval '2 hours'),
	('parked', '0/2', 'bad', '{}', now() - interval '3 hours', NULL);
INSERT INTO relay_sink_skipped (sink, event_id, aggregate_key, event, reason, attempts, parked_at, skipped_by, skipped_at, skip_reason)
VALUES ('bus', 'e1', 'k', '{}', 'down', 3, now() - interval '3 hours', 'ops', now() - interval '2 hours', 'gave up');
INSERT INTO relay_inbox (consumer, event_id, instance_id, outcome, received_at)
VALUES ('correlator', gen_random_uuid(), NULL, 'late', now() - interval '40 days');`)
	if err != nil {
		t.Fatal(err)
	}
	adm, err := admin.New(admin.Config{Pool: b.db.Pool, Journal: b.j})
	if err != nil {
		t.Fatal(err)
	}
	deleted := map[string]int64{}
	ret, err := pgjournal.NewRetention(b.db.Pool, pgjournal.RetentionConfig{
		History: 30 * time.Minute, DedupeWindow: 30 * 24 * time.Hour, BatchSize: 1,
		CompactCounts: adm.CompactCounts,
		OnDeleted:     func(table string, n int64) { deleted[table] += n },
	})
	if err != nil {
		t.Fatal(err)
	}
	round, err := ret.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if round.Tombstoned != 2 {
		t.Errorf("tombstoned %d instances, want 2", round.Tombstoned)
	}
	for _, id := range []uuid.UUID{done, undone} {
		if s, e, i := children(t, b, id); s+e+i != 0 {
			t.Errorf("instance %s ended an hour ago: %d steps, %d events, %d inbox rows kept", id, s, e, i)
		}
		var ctxJSON, lastErr string
		var stone bool
		if err := b.db.Pool.QueryRow(ctx, `SELECT context::text, coalesce(last_error, ''), history_deleted_at IS NOT NULL FROM saga_instances WHERE id = $1`, id).
			Scan(&ctxJSON, &lastErr, &stone); err != nil {
			t.Fatalf("the tombstone of %s: %v", id, err)
		}
		if ctxJSON != "{}" || lastErr != "" || !stone {
			t.Errorf("tombstone %s: context %s, last error %q, marked %v", id, ctxJSON, lastErr, stone)
		}
	}
	for _, id := range []uuid.UUID{recent, running, failed} {
		if s, e, i := children(t, b, id); s != 3 || e != 3 || i != 1 {
			t.Errorf("instance %s must keep its history: %d steps, %d events, %d inbox rows", id, s, e, i)
		}
	}
	if n := count(t, b, `SELECT count(*) FROM saga_instances WHERE id = $1`, expired); n != 0 {
		t.Errorf("the tombstone that ended 40 days ago is still there")
	}
	if n := count(t, b, `SELECT count(*) FROM relay_dead_letters WHERE event_id = 'parked'`); n != 1 {
		t.Errorf("a dead letter nobody re-drove was deleted without --failed-retention")
	}
	for table, q := range map[string]string{
		"re-driven dead letter": `SELECT count(*) FROM relay_dead_letters WHERE event_id = 'redriven'`,
		"skipped delivery":      `SELECT count(*) FROM relay_sink_skipped`,
		"unmatched inbox row":   `SELECT count(*) FROM relay_inbox WHERE instance_id IS NULL`,
	} {
		if n := count(t, b, q); n != 0 {
			t.Errorf("the old %s was kept", table)
		}
	}
	want := map[string]int64{pgjournal.TableSteps: 6, pgjournal.TableEvents: 6, pgjournal.TableInbox: 3,
		pgjournal.TableInstances: 1, pgjournal.TableDeadLet: 1, pgjournal.TableSkipped: 1}
	for table, n := range want {
		if deleted[table] != n {
			t.Errorf("OnDeleted(%s) = %d, want %d (all: %v)", table, deleted[table], n, deleted)
		}
	}
	if n := count(t, b, `SELECT count(*) FROM saga_status_deltas`); n != 0 {
		t.Errorf("%d status deltas left after the round's compaction", n)
	}
	if n := count(t, b, `SELECT count(*) FROM (
		SELECT status, sum(n) AS n FROM saga_status_counts GROUP BY 1 HAVING sum(n) <> 0) c
		FULL JOIN (SELECT status, count(*) AS n FROM saga_instances GROUP BY 1) i USING (status)
		WHERE c.n IS DISTINCT FROM i.n`); n != 0 {
		t.Errorf("the status counts differ from the table in %d statuses", n)
	}

	// A FAILED instance past --failed-retention becomes a tombstone: shown
	// as such, never retried.
	ret, err = pgjournal.NewRetention(b.db.Pool, pgjournal.RetentionConfig{Failed: 30 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if round, err := ret.RunOnce(ctx); err != nil || round.Tombstoned != 1 {
		t.Fatalf("failed retention: %+v, %v; want one tombstone", round, err)
	}
	d, err := adm.Show(ctx, failed)
	if err != nil {
		t.Fatal(err)
	}
	if d.Instance.HistoryDeletedAt == nil || len(d.Events) != 0 || !strings.Contains(d.Instance.StepSummary, "history deleted") || d.Instance.StuckReason != "" {
		t.Errorf("show of a tombstone: history deleted %v, %d events, summary %q, stuck %q", d.Instance.HistoryDeletedAt, len(d.Events), d.Instance.StepSummary, d.Instance.StuckReason)
	}
	_, err = adm.Retry(ctx, failed, "try again", "ops")
	if !errors.Is(err, saga.ErrConflict) || !strings.Contains(err.Error(), "history was deleted by retention") {
		t.Errorf("retry of a tombstone: %v, want a conflict that says its history was deleted", err)
	}
	if n := count(t, b, `SELECT count(*) FROM relay_dead_letters WHERE event_id = 'parked'`); n != 0 {
		t.Errorf("the dead letter parked 3 hours ago was kept past --failed-retention 30m")
	}
}

// TestRetentionKeepsWhatAResyncCanReRead: with a resync slot, a tombstone
// created after the slot's checkpoint time minus the margin is kept past the
// dedupe window (a resync re-reads its trigger); an older one is deleted,
// and with no checkpoint at all nothing is.
func TestRetentionKeepsWhatAResyncCanReRead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	stone := retentionFixture(t, b, saga.StatusCompleted, 2*time.Hour, true)
	ret, err := pgjournal.NewRetention(b.db.Pool, pgjournal.RetentionConfig{
		DedupeWindow: time.Hour, ResyncSlot: "s", ResyncMargin: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	run := func() {
		t.Helper()
		if _, err := ret.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	run()
	if n := count(t, b, `SELECT count(*) FROM saga_instances WHERE id = $1`, stone); n != 1 {
		t.Fatal("a tombstone was deleted while the slot has no checkpoint (a resync would read the whole table)")
	}
	// The checkpoint is from an hour and 55 minutes ago: the resync would
	// re-read rows from 2h05m ago on, the tombstone's trigger among them.
	if _, err := b.db.Pool.Exec(ctx, `INSERT INTO relay_checkpoints (slot_name, lsn, updated_at) VALUES ('s', '0/1', now() - interval '115 minutes')`); err != nil {
		t.Fatal(err)
	}
	run()
	if n := count(t, b, `SELECT count(*) FROM saga_instances WHERE id = $1`, stone); n != 1 {
		t.Fatal("a tombstone a resync could re-read was deleted")
	}
	if _, err := b.db.Pool.Exec(ctx, `UPDATE relay_checkpoints SET updated_at = now()`); err != nil {
		t.Fatal(err)
	}
	run()
	if n := count(t, b, `SELECT count(*) FROM saga_instances WHERE id = $1`, stone); n != 0 {
		t.Fatal("a tombstone past the dedupe window and before the resync window was kept")
	}
}

func count(t *testing.T, b bundle, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := b.db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}
