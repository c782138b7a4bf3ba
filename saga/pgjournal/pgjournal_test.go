package pgjournal_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/pgjournal"
	"github.com/compensa/compensa/test/pgtest"
)

// bundle is one test's database and a journal on PostgreSQL's own clock.
type bundle struct {
	db *pgtest.DB
	j  *pgjournal.Journal
}

func setup(t *testing.T) bundle {
	t.Helper()
	db := pgtest.NewDB(t)
	j, err := pgjournal.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	return bundle{db: db, j: j}
}

func (b bundle) claimed(t *testing.T, d time.Duration) saga.Instance {
	t.Helper()
	inst := saga.Instance{ID: uuid.New(), TenantID: uuid.New(), SagaName: "pg", SagaVersion: 1, TriggerEventID: uuid.New()}
	if err := b.j.Enqueue(ctx, inst); err != nil {
		t.Fatal(err)
	}
	// Claim until this instance is ours: a claim takes the most overdue.
	for range 100 {
		got, err := b.j.ClaimPending(ctx, 100, d)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range got {
			if c.ID == inst.ID {
				return c
			}
		}
	}
	t.Fatalf("instance %s never claimed", inst.ID)
	return saga.Instance{}
}

func begin(t *testing.T, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

func xact(t *testing.T, tx pgx.Tx) string {
	t.Helper()
	var xid string
	if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&xid); err != nil {
		t.Fatal(err)
	}
	return xid
}

func stepDone(step int) saga.Event { return saga.Event{Kind: saga.EventStepCompleted, Step: step} }

// TestTailerNeverSkipsALateCommit: transaction A appends first (lower
// global_seq) and commits last. While A is open, a tailer must not be shown
// B's event, which would move its cursor past A's; once A commits the tailer
// receives both, A's first.
func TestTailerNeverSkipsALateCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a, bb := b.claimed(t, time.Minute), b.claimed(t, time.Minute)

	txA := begin(t, b.db.Pool)
	if _, err := b.j.Append(saga.ContextWithTx(ctx, txA), a.ID, a.LeaseID.UUID, stepDone(0)); err != nil {
		t.Fatal(err)
	}
	txB := begin(t, b.db.Pool)
	if _, err := b.j.Append(saga.ContextWithTx(ctx, txB), bb.ID, bb.LeaseID.UUID, stepDone(0)); err != nil {
		t.Fatal(err)
	}
	if err := txB.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	seqA, seqB := uncommittedSeq(t, txA, a.ID), globalSeq(t, b.db.Pool, bb.ID)
	if !(seqA < seqB) {
		t.Fatalf("setup: A holds %d, B %d; A must hold the lower", seqA, seqB)
	}
	// B is committed and visible to ordinary reads, but not to a tailer.
	for range 20 {
		evs, err := b.j.LoadSince(ctx, 0, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) != 0 {
			t.Fatalf("while A (seq %d) is open the tailer was shown %d events, first seq %d", seqA, len(evs), evs[0].GlobalSeq)
		}
		if head, _ := b.j.HeadSeq(ctx); head != 0 {
			t.Fatalf("while A is open HeadSeq = %d", head)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := txA.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := tail(t, b.j, 0, 2)
	if got[0].GlobalSeq != seqA || got[1].GlobalSeq != seqB {
		t.Fatalf("tailer got seqs %d, %d; want %d then %d", got[0].GlobalSeq, got[1].GlobalSeq, seqA, seqB)
	}
}

// TestTailerReceivesALowerSeqThatCommitsAfterAHigherOneWasRead is the case
// a global_seq cursor cannot survive: B took its transaction id before A, so
// B's event (higher global_seq) is below pg_snapshot_xmin while A is still
// open. The tailer is shown B, and must still receive A after A commits.
func TestTailerReceivesALowerSeqThatCommitsAfterAHigherOneWasRead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a, bb := b.claimed(t, time.Minute), b.claimed(t, time.Minute)

	txB := begin(t, b.db.Pool)
	xact(t, txB) // B's transaction id is older than A's
	txA := begin(t, b.db.Pool)
	if _, err := b.j.Append(saga.ContextWithTx(ctx, txA), a.ID, a.LeaseID.UUID, stepDone(0)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.j.Append(saga.ContextWithTx(ctx, txB), bb.ID, bb.LeaseID.UUID, stepDone(0)); err != nil {
		t.Fatal(err)
	}
	seqA := uncommittedSeq(t, txA, a.ID)
	if err := txB.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	seqB := globalSeq(t, b.db.Pool, bb.ID)
	if !(seqA < seqB) {
		t.Fatalf("setup: A holds %d, B %d", seqA, seqB)
	}
	first := tail(t, b.j, 0, 1)
	if first[0].GlobalSeq != seqB {
		t.Fatalf("tailer was shown seq %d, want B's %d", first[0].GlobalSeq, seqB)
	}
	// A reader that resumes from "global_seq > cursor" would now have lost A
	// for good; this is what it would read once A commits.
	if err := txA.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var naive int
	if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM saga_events WHERE global_seq > $1`, seqB).Scan(&naive); err != nil {
		t.Fatal(err)
	}
	if naive != 0 {
		t.Fatalf("setup: %d events above B", naive)
	}
	rest := tail(t, b.j, seqB, 1)
	if rest[0].GlobalSeq != seqA || rest[0].InstanceID != a.ID {
		t.Fatalf("after B the tailer got seq %d, want A's %d", rest[0].GlobalSeq, seqA)
	}
	if more, err := b.j.LoadSince(ctx, seqA, 10); err != nil || len(more) != 0 {
		t.Fatalf("after A: %d more events, %v", len(more), err)
	}
}

// TestTailerKeepsAnInstancesVersionOrder: a transaction that took its id
// before the one that wrote an instance's version 1 writes version 2. Its
// transaction id is the lower; the ordering key is raised to version 1's so
// that tailers still see version 1 first.
func TestTailerKeepsAnInstancesVersionOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	x := b.claimed(t, time.Minute)
	old := begin(t, b.db.Pool)
	xact(t, old)
	if _, err := b.j.Append(ctx, x.ID, x.LeaseID.UUID, stepDone(0)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.j.Append(saga.ContextWithTx(ctx, old), x.ID, x.LeaseID.UUID, stepDone(1)); err != nil {
		t.Fatal(err)
	}
	if err := old.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := tail(t, b.j, 0, 2)
	if got[0].Version != 1 || got[1].Version != 2 {
		t.Fatalf("tailer got versions %d, %d", got[0].Version, got[1].Version)
	}
	var raised bool
	if err := b.db.Pool.QueryRow(ctx, `SELECT (SELECT xid FROM saga_events WHERE instance_id = $1 AND version = 2)
		= (SELECT xid FROM saga_events WHERE instance_id = $1 AND version = 1)`, x.ID).Scan(&raised); err != nil {
		t.Fatal(err)
	}
	if !raised {
		t.Fatal("version 2's ordering key was not raised to version 1's")
	}
}

// TestTailerKeepsAnInstancesVersionOrderOfAPair is the same for the step's
// event and the terminal event written by one statement (AppendTerminal):
// both keys are raised to version 1's, and the tailer sees 1, 2, 3.
func TestTailerKeepsAnInstancesVersionOrderOfAPair(t *testing.T) {
	t.Parallel()
	b := setup(t)
	x := b.claimed(t, time.Minute)
	old := begin(t, b.db.Pool)
	oldXid := xact(t, old)
	if _, err := b.j.Append(ctx, x.ID, x.LeaseID.UUID, stepDone(0)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.j.AppendTerminal(saga.ContextWithTx(ctx, old), x.ID, x.LeaseID.UUID, stepDone(1), saga.StatusCompleted, ""); err != nil {
		t.Fatal(err)
	}
	if err := old.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := tail(t, b.j, 0, 3)
	if len(got) != 3 || got[0].Version != 1 || got[1].Version != 2 || got[2].Version != 3 {
		t.Fatalf("tailer got %d events: %+v", len(got), got)
	}
	var first, second, third string
	if err := b.db.Pool.QueryRow(ctx, `SELECT
		(SELECT xid::text FROM saga_events WHERE instance_id = $1 AND version = 1),
		(SELECT xid::text FROM saga_events WHERE instance_id = $1 AND version = 2),
		(SELECT xid::text FROM saga_events WHERE instance_id = $1 AND version = 3)`, x.ID).Scan(&first, &second, &third); err != nil {
		t.Fatal(err)
	}
	if first == oldXid || second != first || third != first {
		t.Fatalf("xids %s, %s, %s (the pair's writer %s): versions 2 and 3 must be raised to version 1's", first, second, third, oldXid)
	}
}

// TestFenceUsesTheStatementClock: inside a transaction that began while the
// lease was live, now() stays at the transaction's start; the fence must use
// the time of the write.
func TestFenceUsesTheStatementClock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	inst := b.claimed(t, 300*time.Millisecond)
	tx := begin(t, b.db.Pool)
	if _, err := tx.Exec(ctx, `SELECT now()`); err != nil {
		t.Fatal(err)
	}
	for {
		var expired bool
		if err := tx.QueryRow(ctx, `SELECT clock_timestamp() > $1`, *inst.LeaseExpiresAt).Scan(&expired); err != nil {
			t.Fatal(err)
		}
		if expired {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	var nowFencePasses bool
	if err := tx.QueryRow(ctx, `SELECT lease_expires_at >= now() FROM saga_instances WHERE id = $1`, inst.ID).Scan(&nowFencePasses); err != nil {
		t.Fatal(err)
	}
	if !nowFencePasses {
		t.Fatal("setup: a now() fence should still pass in this transaction")
	}
	_, err := b.j.Append(saga.ContextWithTx(ctx, tx), inst.ID, inst.LeaseID.UUID, stepDone(0))
	if !errors.Is(err, saga.ErrLeaseLost) {
		t.Fatalf("append after expiry in an old transaction: %v, want ErrLeaseLost", err)
	}
	if ok, err := b.j.MarkTerminal(saga.ContextWithTx(ctx, tx), inst.ID, inst.LeaseID.UUID, saga.StatusCompleted, ""); ok || err != nil {
		t.Fatalf("mark terminal after expiry in an old transaction: %t, %v", ok, err)
	}
	// The refusal left the caller's transaction usable.
	if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatalf("caller's transaction after a refused append: %v", err)
	}
}

// TestAppendJoinsTheCallersTransaction: the journal entry, the projection,
// the step record and the caller's own rows commit or roll back together.
func TestAppendJoinsTheCallersTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	inst := b.claimed(t, time.Minute)
	for _, commit := range []bool{false, true} {
		tx := begin(t, b.db.Pool)
		in := saga.ContextWithTx(ctx, tx)
		if _, err := tx.Exec(ctx, `INSERT INTO outbox (id, event_type, payload) VALUES ($1, 'step.done', '{}')`, inst.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := b.j.Append(in, inst.ID, inst.LeaseID.UUID, saga.Event{Kind: saga.EventStepCompleted, Step: 0, StepName: "a"}); err != nil {
			t.Fatal(err)
		}
		inside, err := b.j.Get(in, inst.ID)
		if err != nil || inside.Version != 1 {
			t.Fatalf("inside the transaction: %+v, %v", inside, err)
		}
		outside, _ := b.j.Get(ctx, inst.ID)
		if outside.Version != 0 {
			t.Fatalf("uncommitted append visible outside: version %d", outside.Version)
		}
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		var rows int
		if err := b.db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox) + (SELECT count(*) FROM saga_events) + (SELECT count(*) FROM saga_steps)`).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		got, _ := b.j.Get(ctx, inst.ID)
		if !commit && (rows != 0 || got.Version != 0) {
			t.Fatalf("rollback left %d rows, version %d", rows, got.Version)
		}
		if commit && (rows != 3 || got.Version != 1 || got.CurrentStep != 1) {
			t.Fatalf("commit: %d rows, %+v", rows, got)
		}
	}
}

// TestRefusedWriteReleasesTheRowLock: when the journal opened the
// transaction itself, a refusal rolls it back at once.
func TestRefusedWriteReleasesTheRowLock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	inst := b.claimed(t, time.Minute)
	for _, ev := range []saga.Event{{Kind: "nope"}, stepDone(5)} {
		if _, err := b.j.Append(ctx, inst.ID, inst.LeaseID.UUID, ev); !errors.Is(err, saga.ErrInvalid) {
			t.Fatalf("append %v: %v", ev, err)
		}
	}
	if _, err := b.j.Append(ctx, inst.ID, uuid.New(), stepDone(0)); !errors.Is(err, saga.ErrLeaseLost) {
		t.Fatal(err)
	}
	var open int
	if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND state LIKE 'idle in transaction%'`).Scan(&open); err != nil {
		t.Fatal(err)
	}
	if open != 0 {
		t.Fatalf("%d sessions left idle in transaction", open)
	}
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	tx := begin(t, b.db.Pool)
	if _, err := tx.Exec(short, `SELECT 1 FROM saga_instances WHERE id = $1 FOR UPDATE NOWAIT`, inst.ID); err != nil {
		t.Fatalf("the instance row is still locked: %v", err)
	}
}

// TestRoundTrips: Append and MarkTerminal cost two round trips, in the
// journal's own transaction and in the caller's; ClaimPending and Heartbeat
// one.
func TestRoundTrips(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	var writes atomic.Int64
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1 // one connection: its statement cache is warm after the first call
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		return countingConn{Conn: c, writes: &writes}, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	j, _ := pgjournal.New(pool, nil)
	b := bundle{db: db, j: j}
	first, second := b.claimed(t, time.Minute), b.claimed(t, time.Minute)
	fail := saga.Event{Kind: saga.EventStepFailed, Step: 0, Error: "x"}
	// measure runs fn on the first instance to warm the statement cache (the
	// first use of a statement on a connection also prepares it), then
	// counts the round trips of fn on the second.
	measure := func(what string, want int64, fn func(inst saga.Instance) error) {
		t.Helper()
		if err := fn(first); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		before := writes.Load()
		if err := fn(second); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got := writes.Load() - before; got != want {
			t.Fatalf("%s took %d round trips, want %d", what, got, want)
		}
	}
	measure("append", 2, func(i saga.Instance) error { _, err := j.Append(ctx, i.ID, i.LeaseID.UUID, fail); return err })
	measure("heartbeat", 1, func(i saga.Instance) error {
		_, err := j.Heartbeat(ctx, i.ID, i.LeaseID.UUID, time.Minute)
		return err
	})
	measure("claim", 1, func(saga.Instance) error { _, err := j.ClaimPending(ctx, 10, time.Minute); return err })
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	in := saga.ContextWithTx(ctx, tx)
	measure("append in the caller's transaction", 2, func(i saga.Instance) error {
		_, err := j.Append(in, i.ID, i.LeaseID.UUID, fail)
		return err
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// A group: four instances of its own, two per call; the first call
	// warms the statement cache.
	g1, g2, g3, g4 := b.claimed(t, time.Minute), b.claimed(t, time.Minute), b.claimed(t, time.Minute), b.claimed(t, time.Minute)
	group := func(x, y saga.Instance) error {
		es := []saga.GroupEntry{{InstanceID: x.ID, LeaseID: x.LeaseID.UUID, Event: stepDone(0)}, {InstanceID: y.ID, LeaseID: y.LeaseID.UUID, Event: stepDone(0), Final: saga.StatusCompleted}}
		if err := j.AppendGroup(ctx, es); err != nil {
			return err
		}
		return errors.Join(es[0].Err, es[1].Err)
	}
	if err := group(g1, g2); err != nil {
		t.Fatal(err)
	}
	before := writes.Load()
	if err := group(g3, g4); err != nil {
		t.Fatal(err)
	}
	if got := writes.Load() - before; got != 2 {
		t.Fatalf("a group of two appends took %d round trips, want 2", got)
	}
	measure("mark terminal", 2, func(i saga.Instance) error {
		ok, err := j.MarkTerminal(ctx, i.ID, i.LeaseID.UUID, saga.StatusCompleted, "")
		if !ok && err == nil {
			err = errors.New("lease not held")
		}
		return err
	})
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// globalSeq returns the committed global_seq of the instance's first event
// (0 when none is visible).
func globalSeq(t *testing.T, pool *pgxpool.Pool, id uuid.UUID) int64 {
	t.Helper()
	var seq int64
	err := pool.QueryRow(ctx, `SELECT COALESCE(min(global_seq), 0) FROM saga_events WHERE instance_id = $1`, id).Scan(&seq)
	if err != nil {
		t.Fatal(err)
	}
	return seq
}

func uncommittedSeq(t *testing.T, tx pgx.Tx, id uuid.UUID) int64 {
	t.Helper()
	var seq int64
	if err := tx.QueryRow(ctx, `SELECT global_seq FROM saga_events WHERE instance_id = $1`, id).Scan(&seq); err != nil {
		t.Fatal(err)
	}
	return seq
}

// tail reads n events after `after`, waiting while older transactions of
// the cluster (other tests) keep them below the horizon.
func tail(t *testing.T, j *pgjournal.Journal, after int64, n int) []saga.RecordedEvent {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var got []saga.RecordedEvent
	for len(got) < n {
		evs, err := j.LoadSince(ctx, after, n-len(got))
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("tailer got %d of %d events", len(got), n)
			}
			time.Sleep(5 * time.Millisecond)
			continue
		}
		got = append(got, evs...)
		after = evs[len(evs)-1].GlobalSeq
	}
	return got
}

// TestEnqueueConflictKeepsTheCallersTransaction: a duplicate start is
// ErrConflict, not a unique violation that would abort the caller's
// transaction.
func TestEnqueueConflictKeepsTheCallersTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	inst := saga.Instance{ID: uuid.New(), TenantID: uuid.New(), SagaName: "pg", SagaVersion: 1, TriggerEventID: uuid.New()}
	tx := begin(t, b.db.Pool)
	in := saga.ContextWithTx(ctx, tx)
	if err := b.j.Enqueue(in, inst); err != nil {
		t.Fatal(err)
	}
	sameID := inst
	sameID.TriggerEventID = uuid.New()
	sameTrigger := inst
	sameTrigger.ID = uuid.New()
	for _, dup := range []saga.Instance{sameID, sameTrigger} {
		if err := b.j.Enqueue(in, dup); !errors.Is(err, saga.ErrConflict) {
			t.Fatalf("duplicate: %v, want ErrConflict", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit after conflicts: %v", err)
	}
	if _, err := b.j.Get(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
}
