package pgjournal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/saga"
)

// Config tunes a Journal. A nil *Config means the defaults.
type Config struct {
	// Now, when set and returning non-nil, is the journal's one clock
	// instead of PostgreSQL's clock_timestamp(). Every instant the journal
	// uses (claims, lease expiry and fences, next_attempt_at, event and
	// instance stamps) then comes from it: it is how tests cross a lease's
	// expiry to the microsecond. Production leaves it nil.
	Now func() *time.Time
	// OldestFirst makes ClaimPending take the oldest due instances whoever
	// their tenant, as one queue. By default claims are shared between the
	// tenants with due work (see ClaimPending).
	OldestFirst bool
	// TenantWeights gives tenants a larger (or smaller) share of each
	// claim: a tenant of weight 3 gets three times the share of a tenant
	// of weight 1 while both have due work. Absent tenants weigh 1;
	// weights must be between 1 and 1000.
	TenantWeights map[uuid.UUID]int
}

// Journal is the PostgreSQL saga.Journal over saga_instances, saga_steps and
// saga_events. It is safe for concurrent use.
type Journal struct {
	pool *pgxpool.Pool
	now  func() *time.Time

	oldestFirst bool
	weights     map[uuid.UUID]int
	// fair is the state of the claims shared between tenants.
	fair fairState
}

var _ saga.Journal = (*Journal)(nil)

// New returns a journal over pool. A nil pool is ErrInvalid.
func New(pool *pgxpool.Pool, cfg *Config) (*Journal, error) {
	if pool == nil {
		return nil, saga.Errorf(saga.ErrInvalid, "pgjournal: the pool is nil")
	}
	j := &Journal{pool: pool}
	if cfg != nil {
		j.now = cfg.Now
		j.oldestFirst = cfg.OldestFirst
		for t, w := range cfg.TenantWeights {
			if w < 1 || w > maxTenantWeight {
				return nil, saga.Errorf(saga.ErrInvalid, "pgjournal: tenant %s has weight %d; weights are 1 to %d", t, w, maxTenantWeight)
			}
		}
		j.weights = cfg.TenantWeights
	}
	return j, nil
}

// clock is the value of the statements' clock parameter: the injected time,
// or NULL for the statement's clock_timestamp().
func (j *Journal) clock() any {
	if j.now == nil {
		return nil
	}
	if t := j.now(); t != nil {
		return *t
	}
	return nil
}

// querier is what both a pool and a transaction offer.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// q returns the caller's transaction when ctx carries one, else the pool.
func (j *Journal) q(ctx context.Context) querier {
	if tx, ok := saga.TxFromContext(ctx); ok {
		return tx
	}
	return j.pool
}

// Enqueue implements saga.Journal.
func (j *Journal) Enqueue(ctx context.Context, inst saga.Instance) error {
	if err := saga.CheckNew(inst); err != nil {
		return err
	}
	var next any
	if !inst.NextAttemptAt.IsZero() {
		next = inst.NextAttemptAt
	}
	ctxJSON := inst.Context
	if len(ctxJSON) == 0 {
		ctxJSON = json.RawMessage(`{}`)
	}
	var inserted bool
	err := j.q(ctx).QueryRow(ctx, sqlEnqueue, inst.ID, inst.TenantID, inst.WorkspaceID, inst.SagaName,
		inst.SagaVersion, inst.TriggerEventID, inst.CorrelationID, []byte(ctxJSON), next, inst.TimeoutAt, j.clock(), inst.TraceParent).Scan(&inserted)
	if errors.Is(err, pgx.ErrNoRows) {
		var idTaken bool
		if err := j.q(ctx).QueryRow(ctx, sqlEnqueueConflict, inst.ID).Scan(&idTaken); err != nil {
			return fmt.Errorf("pgjournal: enqueue %s: %w", inst.ID, err)
		}
		if idTaken {
			return saga.Errorf(saga.ErrConflict, "saga instance %s already exists", inst.ID)
		}
		return saga.Errorf(saga.ErrConflict, "trigger event %s already started %s v%d", inst.TriggerEventID, inst.SagaName, inst.SagaVersion)
	}
	if err != nil {
		return fmt.Errorf("pgjournal: enqueue %s: %w", inst.ID, err)
	}
	return nil
}

// ClaimPending implements saga.Journal. Claims are shared between tenants
// (unless Config.OldestFirst): when more than one tenant has due work, each
// claim takes the oldest due instances of each of up to batchSize tenants,
// in turn from where the last claim stopped, each tenant's share of the
// batch in proportion to its weight; one tenant's backlog then never makes
// another's work wait behind all of it. With one tenant (the journal looks
// again every fairRecheck) the claim is the oldest-first statement alone.
func (j *Journal) ClaimPending(ctx context.Context, batchSize int, d time.Duration) ([]saga.Instance, error) {
	if batchSize <= 0 {
		return nil, saga.Errorf(saga.ErrInvalid, "claim: batch size must be positive, got %d", batchSize)
	}
	if d < time.Microsecond {
		return nil, saga.Errorf(saga.ErrInvalid, "claim: lease duration must be at least 1µs, got %s", d)
	}
	// The claim walks saga_claim_idx in order (sqlClaimPlan), in a
	// transaction of its own sent as one pipeline: one round trip. Inside a
	// caller's transaction the settings would outlive the claim, so the
	// statement runs there as the planner chooses.
	_, inTx := saga.TxFromContext(ctx)
	var br pgx.BatchResults
	var rows pgx.Rows
	if inTx {
		var err error
		if rows, err = j.q(ctx).Query(ctx, sqlClaim, j.clock(), batchSize, d.Microseconds()); err != nil {
			return nil, fmt.Errorf("pgjournal: claim: %w", err)
		}
	} else {
		shares, err := j.tenantShares(ctx, batchSize)
		if err != nil {
			return nil, err
		}
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		b.Queue(sqlClaimPlan)
		if shares != nil {
			b.Queue(sqlClaimTenants, j.clock(), batchSize, d.Microseconds(), shares.tenants, shares.quotas)
		} else {
			b.Queue(sqlClaim, j.clock(), batchSize, d.Microseconds())
		}
		b.Queue("COMMIT")
		br = j.pool.SendBatch(ctx, b)
		defer br.Close()
		for range 2 {
			if _, err := br.Exec(); err != nil {
				return nil, fmt.Errorf("pgjournal: claim: %w", err)
			}
		}
		rows, _ = br.Query()
	}
	var ir instanceRow
	var interrupted *int
	dest := append(ir.dest(nil), &interrupted)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (saga.Instance, error) {
		err := r.Scan(dest...)
		inst := ir.instance()
		inst.InterruptedStep = interrupted
		return inst, err
	})
	if err != nil {
		return nil, fmt.Errorf("pgjournal: claim: %w", err)
	}
	if br != nil {
		if _, err := br.Exec(); err != nil {
			return nil, fmt.Errorf("pgjournal: claim: commit: %w", err)
		}
		if err := br.Close(); err != nil {
			return nil, fmt.Errorf("pgjournal: claim: %w", err)
		}
	}
	if out == nil {
		out = []saga.Instance{}
	}
	return out, nil
}

// NextDue implements saga.DueReporter in one index read.
func (j *Journal) NextDue(ctx context.Context) (time.Duration, bool, error) {
	var us float64
	err := j.q(ctx).QueryRow(ctx, sqlNextDue, j.clock()).Scan(&us)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("pgjournal: next due: %w", err)
	}
	return time.Duration(us) * time.Microsecond, true, nil
}

// TakeRateTurn implements saga.RateTaker in one statement.
func (j *Journal) TakeRateTurn(ctx context.Context, id, leaseID uuid.UUID, key string, every time.Duration) (time.Duration, error) {
	if every < time.Microsecond {
		return 0, saga.Errorf(saga.ErrInvalid, "rate turn: turns must be at least 1µs apart, got %s", every)
	}
	every = every.Truncate(time.Microsecond)
	var wait time.Duration
	take := func(tx pgx.Tx) error {
		var (
			held       *time.Time
			now        time.Time
			next, last *time.Time
		)
		err := tx.QueryRow(ctx, sqlRateTurnInstance, id, leaseID, j.clock()).Scan(&held, &now)
		if errors.Is(err, pgx.ErrNoRows) {
			return saga.Errorf(saga.ErrLeaseLost, "instance %s: lease %s is not held; no rate turn was taken", id, leaseID)
		}
		if err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, sqlRateTurnKey, key, now).Scan(&next, &last); err != nil {
			return err
		}
		turn, nextAt, lastAt, use := saga.NextRateTurn(now, held, *next, last, every)
		if _, err := tx.Exec(ctx, sqlRateTurnKeyUpdate, key, nextAt, lastAt); err != nil {
			return err
		}
		if use {
			if held != nil {
				_, err = tx.Exec(ctx, sqlRateTurnUsed, id)
			}
			return err
		}
		wait = turn.Sub(now)
		_, err = tx.Exec(ctx, sqlRateTurnGiveBack, id, turn)
		return err
	}
	var err error
	if tx, ok := saga.TxFromContext(ctx); ok {
		err = take(tx)
	} else {
		err = pgx.BeginFunc(ctx, j.pool, take)
	}
	switch {
	case errors.Is(err, saga.ErrLeaseLost):
		return 0, err
	case err != nil:
		return 0, fmt.Errorf("pgjournal: take a rate turn: %w", err)
	}
	return wait, nil
}

// Heartbeat implements saga.Journal in one statement.
func (j *Journal) Heartbeat(ctx context.Context, id, leaseID uuid.UUID, d time.Duration) (bool, error) {
	if d < time.Microsecond {
		// The lease is checked first, so that a zombie learns nothing from
		// a bad argument either.
		var held bool
		if err := j.q(ctx).QueryRow(ctx, sqlHoldsLease, id, leaseID, j.clock()).Scan(&held); err != nil {
			return false, fmt.Errorf("pgjournal: heartbeat %s: %w", id, err)
		}
		if !held {
			return false, nil
		}
		return false, saga.Errorf(saga.ErrInvalid, "heartbeat: lease duration must be at least 1µs, got %s", d)
	}
	tag, err := j.q(ctx).Exec(ctx, sqlHeartbeat, id, leaseID, d.Microseconds(), j.clock())
	if err != nil {
		return false, fmt.Errorf("pgjournal: heartbeat %s: %w", id, err)
	}
	return tag.RowsAffected() == 1, nil
}

// Release gives back the lease leaseID of instance id, whose holder runs no
// attempt now: the lease and the open step are cleared, and the instance is
// claimable at once. (false, nil) when the lease is not held. One
// statement, as the heartbeat it replaces.
func (j *Journal) Release(ctx context.Context, id, leaseID uuid.UUID) (bool, error) {
	tag, err := j.q(ctx).Exec(ctx, sqlRelease, id, leaseID, j.clock())
	if err != nil {
		return false, fmt.Errorf("pgjournal: release %s: %w", id, err)
	}
	return tag.RowsAffected() == 1, nil
}

// HeartbeatGroup implements saga.GroupHeartbeater in one statement.
func (j *Journal) HeartbeatGroup(ctx context.Context, leases []saga.LeaseRef, d time.Duration) ([]saga.LeaseState, error) {
	if d <= 0 {
		return nil, saga.Errorf(saga.ErrInvalid, "lease duration must be positive, got %s", d)
	}
	ids := make([][16]byte, len(leases))
	lids := make([][16]byte, len(leases))
	at := make(map[uuid.UUID]int, len(leases))
	for i, l := range leases {
		ids[i], lids[i] = l.InstanceID, l.LeaseID
		at[l.InstanceID] = i
	}
	rows, err := j.q(ctx).Query(ctx, sqlHeartbeatGroup, ids, lids, d.Microseconds(), j.clock())
	if err != nil {
		return nil, fmt.Errorf("pgjournal: heartbeat %d leases: %w", len(leases), err)
	}
	out := make([]saga.LeaseState, len(leases))
	var id uuid.UUID
	var extended, held bool
	if _, err := pgx.ForEachRow(rows, []any{&id, &extended, &held}, func() error {
		switch {
		case extended:
			out[at[id]] = saga.LeaseExtended
		case held:
			out[at[id]] = saga.LeaseBusy
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("pgjournal: heartbeat %d leases: %w", len(leases), err)
	}
	return out, nil
}

// Append implements saga.Journal in two round trips: the locked read, then
// the write (with BEGIN and COMMIT riding along when the journal opens the
// transaction itself).
func (j *Journal) Append(ctx context.Context, id, leaseID uuid.UUID, ev saga.Event) (int64, error) {
	var version int64
	err := j.mutateAll(ctx, sqlLockByID, id, func(rows []locked) ([]saga.Transition, error) {
		if len(rows) == 0 {
			return nil, notFound(id)
		}
		trs, err := decideAppend(rows[0], leaseID, ev, "", "")
		if err != nil {
			return nil, err
		}
		version = trs[len(trs)-1].Instance.Version
		return trs, nil
	})
	if err != nil {
		return 0, err
	}
	return version, nil
}

// AppendTerminal implements saga.TerminalAppender: Append's event and
// MarkTerminal's terminal event from one locking read, written in one
// statement (sqlWritePair), instead of two reads and two writes.
func (j *Journal) AppendTerminal(ctx context.Context, id, leaseID uuid.UUID, ev saga.Event, final saga.Status, reason string) (int64, error) {
	if final == "" {
		return 0, saga.Errorf(saga.ErrInvalid, "instance %s: AppendTerminal needs a terminal status", id)
	}
	var version int64
	err := j.mutateAll(ctx, sqlLockByID, id, func(rows []locked) ([]saga.Transition, error) {
		if len(rows) == 0 {
			return nil, notFound(id)
		}
		trs, err := decideAppend(rows[0], leaseID, ev, final, reason)
		if err != nil {
			return nil, err
		}
		version = trs[len(trs)-1].Instance.Version
		return trs, nil
	})
	if err != nil {
		return 0, err
	}
	return version, nil
}

func notFound(id uuid.UUID) error {
	return saga.Errorf(saga.ErrNotFound, "saga instance %s does not exist", id)
}

// decideAppend is Append's decision on the locked row r (AppendTerminal's
// when final is set).
func decideAppend(r locked, leaseID uuid.UUID, ev saga.Event, final saga.Status, reason string) ([]saga.Transition, error) {
	return saga.DecideAppend(r.inst, r.cur, leaseID, ev, final, reason, r.now)
}

// AppendGroup implements saga.GroupAppender in two round trips: the locking
// read of every instance (sqlLockByIDs), then the written entries' one
// statement (sqlWriteGroup; with BEGIN and COMMIT riding along when the
// journal opens the transaction itself).
func (j *Journal) AppendGroup(ctx context.Context, entries []saga.GroupEntry) error {
	if len(entries) == 0 {
		return nil
	}
	ids := make([][16]byte, len(entries))
	for i, e := range entries {
		ids[i] = e.InstanceID
	}
	if err := saga.CheckGroup(entries); err != nil {
		return err
	}
	s, err := j.open(ctx)
	if err != nil {
		return err
	}
	defer s.close()

	rows, err := s.lockRead(ctx, sqlLockByIDs, ids, j.clock())
	if err != nil {
		return fmt.Errorf("pgjournal: read a group of %d instances: %w", len(entries), err)
	}
	byID := make(map[uuid.UUID]locked, len(rows))
	for _, r := range rows {
		byID[r.inst.ID] = r
	}
	var written []int
	var trs [][]saga.Transition
	for i := range entries {
		e := &entries[i]
		r, ok := byID[e.InstanceID]
		if !ok {
			e.Err = notFound(e.InstanceID)
			continue
		}
		t, err := decideAppend(r, e.LeaseID, e.Event, e.Final, e.Reason)
		if err != nil {
			e.Err = err
			continue
		}
		written = append(written, i)
		trs = append(trs, t)
	}
	if len(written) == 0 {
		return nil // nothing to write: close rolls the empty transaction back
	}
	if err = s.write(ctx, trs, fmt.Sprintf("a group of %d instances", len(written))); err != nil {
		return err
	}
	for k, i := range written {
		entries[i].Version = trs[k][len(trs[k])-1].Instance.Version
	}
	return nil
}

// MarkTerminal implements saga.Journal, in two round trips like Append.
func (j *Journal) MarkTerminal(ctx context.Context, id, leaseID uuid.UUID, final saga.Status, reason string) (bool, error) {
	var done bool
	err := j.mutate(ctx, sqlLockByID, id, func(rows []locked) (*saga.Transition, error) {
		if len(rows) == 0 || !saga.HoldsLease(rows[0].inst, leaseID, rows[0].now) {
			return nil, nil
		}
		kind, err := saga.TerminalKind(final)
		if err != nil {
			return nil, err
		}
		tr, err := saga.Advance(rows[0].inst, rows[0].cur, saga.Event{Kind: kind, Step: -1, Reason: reason}, rows[0].now)
		if err != nil {
			return nil, err
		}
		done = true
		return &tr, nil
	})
	if err != nil {
		return false, err
	}
	return done, nil
}

// RequestRetry implements saga.Journal.
func (j *Journal) RequestRetry(ctx context.Context, id uuid.UUID, reason, actor string) error {
	return j.request(ctx, id, saga.Event{Kind: saga.EventRetryRequested, Step: -1, Reason: reason, Actor: actor})
}

// RequestCancel implements saga.Journal.
func (j *Journal) RequestCancel(ctx context.Context, id uuid.UUID, reason, actor string) error {
	return j.request(ctx, id, saga.Event{Kind: saga.EventCancelRequested, Step: -1, Reason: reason, Actor: actor})
}

// RequestPause implements saga.Journal.
func (j *Journal) RequestPause(ctx context.Context, id uuid.UUID, reason, actor string) error {
	return j.request(ctx, id, saga.Event{Kind: saga.EventPaused, Step: -1, Reason: reason, Actor: actor})
}

// RequestRestart implements saga.Journal.
func (j *Journal) RequestRestart(ctx context.Context, id uuid.UUID, step int, reason, actor string) error {
	return j.request(ctx, id, saga.Event{Kind: saga.EventRestarted, Step: step, Reason: reason, Actor: actor})
}

// RequestResume implements saga.Journal.
func (j *Journal) RequestResume(ctx context.Context, id uuid.UUID, reason, actor string) error {
	return j.request(ctx, id, saga.Event{Kind: saga.EventResumed, Step: -1, Reason: reason, Actor: actor})
}

func (j *Journal) request(ctx context.Context, id uuid.UUID, ev saga.Event) error {
	return j.mutate(ctx, sqlLockByID, id, func(rows []locked) (*saga.Transition, error) {
		if len(rows) == 0 {
			return nil, saga.Errorf(saga.ErrNotFound, "saga instance %s does not exist", id)
		}
		tr, err := saga.Advance(rows[0].inst, rows[0].cur, ev, rows[0].now)
		if err != nil {
			return nil, err
		}
		return &tr, nil
	})
}

// DeliverReply implements saga.Journal.
func (j *Journal) DeliverReply(ctx context.Context, correlationID uuid.UUID, reply json.RawMessage, actor string) (uuid.UUID, error) {
	var id uuid.UUID
	err := j.mutate(ctx, sqlLockByCorrelation, correlationID, func(rows []locked) (*saga.Transition, error) {
		switch len(rows) {
		case 0:
			return nil, saga.Errorf(saga.ErrNotFound, "no RUNNING instance waits on correlation id %s (a late or unknown reply)", correlationID)
		case 1:
		default:
			return nil, saga.Errorf(saga.ErrConflict, "%d instances wait on correlation id %s", len(rows), correlationID)
		}
		r := rows[0]
		ev := saga.Event{Kind: saga.EventReplyReceived, Step: r.inst.CurrentStep, CorrelationID: correlationID, Output: reply, Actor: actor}
		tr, err := saga.Advance(r.inst, r.cur, ev, r.now)
		if err != nil {
			return nil, err
		}
		id = r.inst.ID
		return &tr, nil
	})
	if err != nil {
		return uuid.Nil, err
	}
	return id, nil
}

// locked is one row of a locking read: the projection, its current step's
// record and the statement's clock.
type locked struct {
	inst saga.Instance
	cur  *saga.StepRecord
	now  time.Time
}

// mutate is every write but Enqueue, Claim and Heartbeat: read and lock the
// rows (lockSQL with key and the clock), let decide say what to store, and
// store it. decide returning (nil, nil) writes nothing. In the caller's
// transaction that is two round trips; in its own, BEGIN rides with the read
// and COMMIT with the write, so it is two as well.
func (j *Journal) mutate(ctx context.Context, lockSQL string, key uuid.UUID, decide func([]locked) (*saga.Transition, error)) (err error) {
	return j.mutateAll(ctx, lockSQL, key, func(rows []locked) ([]saga.Transition, error) {
		tr, err := decide(rows)
		if err != nil || tr == nil {
			return nil, err
		}
		return []saga.Transition{*tr}, nil
	})
}

// mutateAll is mutate for several transitions of one instance, each applied
// to the previous one's result: one locking read, then one batch with a
// write per transition (each checks the version the previous one wrote).
func (j *Journal) mutateAll(ctx context.Context, lockSQL string, key uuid.UUID, decide func([]locked) ([]saga.Transition, error)) (err error) {
	s, err := j.open(ctx)
	if err != nil {
		return err
	}
	defer s.close()

	rows, err := s.lockRead(ctx, lockSQL, key, j.clock())
	if err != nil {
		return fmt.Errorf("pgjournal: read %s: %w", key, err)
	}
	trs, err := decide(rows)
	if err != nil || len(trs) == 0 {
		return err
	}
	return s.write(ctx, [][]saga.Transition{trs}, key.String())
}

// lockRead runs a locking read (lockSQL with key and the clock), with BEGIN
// riding along when the session opens its own transaction.
func (s *session) lockRead(ctx context.Context, lockSQL string, key, clock any) ([]locked, error) {
	read := &pgx.Batch{}
	if s.own() {
		read.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
		read.Queue(sqlLockPlan)
	}
	read.Queue(lockSQL, key, clock)
	return s.readLocked(ctx, read)
}

// write stores each instance's transitions (trss, one slice per instance)
// in one batch, with COMMIT riding along when the session opened its own
// transaction; what names the write in errors. Several instances with one
// transition each (or a step and its terminal event) go in one statement,
// sqlWriteGroup; otherwise each transition has its own.
func (s *session) write(ctx context.Context, trss [][]saga.Transition, what string) (err error) {
	b := &pgx.Batch{}
	together := len(trss) > 1 && !slices.ContainsFunc(trss, func(trs []saga.Transition) bool {
		return len(trs) != 1 && !isPair(trs)
	})
	if together {
		b.Queue(sqlWriteGroup, groupArgs(trss)...)
	} else {
		for _, trs := range trss {
			queueWrite(b, trs)
		}
	}
	if s.own() {
		b.Queue("COMMIT")
	}
	br := s.q.SendBatch(ctx, b)
	if together {
		err = readGroup(br, trss)
	} else {
		for _, trs := range trss {
			if err = readWrite(br, trs); err != nil {
				break
			}
		}
	}
	if err == nil && s.own() {
		if _, err = br.Exec(); err != nil {
			err = fmt.Errorf("pgjournal: commit %s: %w", what, err)
		}
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("pgjournal: write %s: %w", what, cerr)
	}
	return err
}

// session is where one mutation runs: the caller's transaction, or a
// connection of the pool on which the journal runs its own.
type session struct {
	q    querier
	conn *pgxpool.Conn // nil in the caller's transaction
}

func (j *Journal) open(ctx context.Context) (*session, error) {
	if tx, ok := saga.TxFromContext(ctx); ok {
		return &session{q: tx}, nil
	}
	c, err := j.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("pgjournal: acquire a connection: %w", err)
	}
	return &session{q: c, conn: c}, nil
}

func (s *session) own() bool { return s.conn != nil }

// close ends the journal's own transaction if it is still open (a refused
// or failed mutation: nothing was written) and returns the connection. In
// the caller's transaction it does nothing: the caller commits or rolls
// back.
func (s *session) close() {
	if s.conn == nil {
		return
	}
	if s.conn.Conn().PgConn().TxStatus() != 'I' && !s.conn.Conn().IsClosed() {
		// Detached from the caller's context: a cancelled caller must still
		// release the row lock now, not when the connection is reaped.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, _ = s.conn.Exec(ctx, "ROLLBACK")
		cancel()
	}
	// A connection still in a transaction is destroyed by Release.
	s.conn.Release()
}

func (s *session) readLocked(ctx context.Context, b *pgx.Batch) ([]locked, error) {
	br := s.q.SendBatch(ctx, b)
	if s.own() {
		for range 2 { // BEGIN and sqlLockPlan
			if _, err := br.Exec(); err != nil {
				br.Close()
				return nil, err
			}
		}
	}
	rows, err := br.Query()
	if err != nil {
		br.Close()
		return nil, err
	}
	// One set of scan targets for every row: each row is copied out of it.
	var ir instanceRow
	var st stepRow
	var now time.Time
	dest := make([]any, 0, 36)
	dest = st.appendDest(ir.dest(dest))
	dest = append(dest, &now)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (locked, error) {
		if err := r.Scan(dest...); err != nil {
			return locked{}, err
		}
		return locked{inst: ir.instance(), cur: st.record(), now: now.UTC()}, nil
	})
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return out, err
}

// queueWrite queues the statement(s) that store trs, transitions of one
// instance each applied to the previous one's result. A step's event and the
// terminal event that follows it are one statement (sqlWritePair: the
// projection updated once, one row version and one set of index entries).
func queueWrite(b *pgx.Batch, trs []saga.Transition) {
	if isPair(trs) {
		b.Queue(sqlWritePair, pairArgs(trs[0], trs[1])...)
		return
	}
	for _, tr := range trs {
		b.Queue(sqlWrite, writeArgs(tr)...)
	}
}

func isPair(trs []saga.Transition) bool { return len(trs) == 2 && trs[1].Step == nil }

// readWrite reads the results of queueWrite's statements.
func readWrite(br pgx.BatchResults, trs []saga.Transition) error {
	if isPair(trs) {
		return readPair(br, trs[0])
	}
	for _, tr := range trs {
		var seq int64
		err := br.QueryRow().Scan(&seq)
		if errors.Is(err, pgx.ErrNoRows) {
			err = fmt.Errorf("instance %s changed under its row lock (version %d expected): nothing was written", tr.Instance.ID, tr.Instance.Version-1)
		}
		if err != nil {
			return fmt.Errorf("pgjournal: write %s (%s): %w", tr.Instance.ID, tr.Event.Kind, err)
		}
	}
	return nil
}

// writeArgs are sqlWrite's parameters for a transition.
func writeArgs(tr saga.Transition) []any {
	args := projectionArgs(make([]any, 0, 34), tr, tr.Instance.Version-1)
	return eventArgs(stepArgs(args, tr), tr)
}

// pairArgs are sqlWritePair's parameters: the projection after second, the
// version before first, first's step record, both events.
func pairArgs(first, second saga.Transition) []any {
	args := projectionArgs(make([]any, 0, 37), second, first.Instance.Version-1)
	return eventArgs(eventArgs(stepArgs(args, first), first), second)
}

// projectionArgs appends parameters $1-$20: the projection after tr, the
// version the write expects to find (read), held_since, paused_from and
// open_step.
func projectionArgs(args []any, tr saga.Transition, read int64) []any {
	in := tr.Instance
	return append(args,
		[16]byte(in.ID), string(in.Status), in.CurrentStep, jsonArg(in.Context), in.Attempt, in.NextAttemptAt,
		in.LastError, uuidArg(in.LeaseID), in.LeaseExpiresAt, in.Version, uuidArg(in.AwaitingCorrelationID),
		in.AwaitingUntil, jsonArg(in.Reply), in.CompensationReason, in.UpdatedAt, in.CompletedAt,
		read, in.HeldSince, string(in.PausedFrom), in.OpenStep,
	)
}

// stepArgs appends parameters $21-$31: tr's step record, if any.
func stepArgs(args []any, tr saga.Transition) []any {
	if s := tr.Step; s != nil {
		return append(args, s.Sequence, true, s.Name, string(s.Status), s.Attempts, s.CompensationAttempts,
			jsonArg(s.Output), s.LastError, s.StartedAt, s.CompletedAt, s.CompensatedAt)
	}
	return append(args, 0, false, "", string(saga.StepPending), 0, 0, nil, "", nil, nil, nil)
}

// eventArgs appends an event's kind, step and payload.
func eventArgs(args []any, tr saga.Transition) []any {
	return append(args, string(tr.Event.Kind), tr.Event.Step, eventPayload(tr))
}

// eventPayload is the journal entry's payload column for tr's event.
func eventPayload(tr saga.Transition) []byte {
	payload, _ := json.Marshal(tr.Event.Event) // an Event always marshals
	return payload
}

// readPair reads sqlWritePair's result: two events, or none when the
// projection's version was not the one read.
func readPair(br pgx.BatchResults, first saga.Transition) error {
	rows, err := br.Query()
	if err != nil {
		return fmt.Errorf("pgjournal: write %s (%s and the terminal event): %w", first.Instance.ID, first.Event.Kind, err)
	}
	n := 0
	for rows.Next() {
		n++
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("pgjournal: write %s (%s and the terminal event): %w", first.Instance.ID, first.Event.Kind, err)
	}
	if n != 2 {
		return fmt.Errorf("pgjournal: write %s: instance changed under its row lock (version %d expected): nothing was written", first.Instance.ID, first.Instance.Version-1)
	}
	return nil
}

// groupArgs are sqlWriteGroup's parameters for several instances' writes,
// each one transition or a pair (a step and the terminal event after it): a
// column of the projection after the last transition per parameter, then
// the step records' columns, then the events' columns.
func groupArgs(trss [][]saga.Transition) []any {
	n := len(trss)
	var (
		id                                      = make([][16]byte, 0, n)
		status, lastErr, compReason, pausedFrom = make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
		curStep, attempt                        = make([]int, 0, n), make([]int, 0, n)
		openStep                                = make([]*int, 0, n)
		ctxJSON, reply                          = make([][]byte, 0, n), make([][]byte, 0, n)
		next, updated                           = make([]time.Time, 0, n), make([]time.Time, 0, n)
		leaseExp, awaitUntil, completed, held   = make([]*time.Time, 0, n), make([]*time.Time, 0, n), make([]*time.Time, 0, n), make([]*time.Time, 0, n)
		lease, awaitCorr                        = make([]pgtype.UUID, 0, n), make([]pgtype.UUID, 0, n)
		version, read                           = make([]int64, 0, n), make([]int64, 0, n)
		sID                                     [][16]byte
		sSeq, sAttempts, sCompAttempts          []int
		sName, sStatus, sLastErr                []string
		sOutput                                 [][]byte
		sStarted, sCompleted, sCompensated      []*time.Time
		eID                                     = make([][16]byte, 0, n)
		eVersion                                = make([]int64, 0, n)
		eKind                                   = make([]string, 0, n)
		eStep, eOrd                             = make([]int, 0, n), make([]int, 0, n)
		ePayload                                = make([][]byte, 0, n)
	)
	for _, trs := range trss {
		first, last := trs[0], trs[len(trs)-1]
		in := last.Instance
		id = append(id, in.ID)
		status = append(status, string(in.Status))
		curStep = append(curStep, in.CurrentStep)
		ctxJSON = append(ctxJSON, jsonBytes(in.Context))
		attempt = append(attempt, in.Attempt)
		next = append(next, in.NextAttemptAt)
		lastErr = append(lastErr, in.LastError)
		lease = append(lease, uuidArg(in.LeaseID))
		leaseExp = append(leaseExp, in.LeaseExpiresAt)
		version = append(version, in.Version)
		awaitCorr = append(awaitCorr, uuidArg(in.AwaitingCorrelationID))
		awaitUntil = append(awaitUntil, in.AwaitingUntil)
		reply = append(reply, jsonBytes(in.Reply))
		compReason = append(compReason, in.CompensationReason)
		updated = append(updated, in.UpdatedAt)
		completed = append(completed, in.CompletedAt)
		read = append(read, first.Instance.Version-1)
		held = append(held, in.HeldSince)
		pausedFrom = append(pausedFrom, string(in.PausedFrom))
		openStep = append(openStep, in.OpenStep)
		if st := first.Step; st != nil {
			sID = append(sID, in.ID)
			sSeq, sName, sStatus = append(sSeq, st.Sequence), append(sName, st.Name), append(sStatus, string(st.Status))
			sAttempts, sCompAttempts = append(sAttempts, st.Attempts), append(sCompAttempts, st.CompensationAttempts)
			sOutput, sLastErr = append(sOutput, jsonBytes(st.Output)), append(sLastErr, st.LastError)
			sStarted, sCompleted, sCompensated = append(sStarted, st.StartedAt), append(sCompleted, st.CompletedAt), append(sCompensated, st.CompensatedAt)
		}
		for _, tr := range trs {
			payload := eventPayload(tr)
			eID, eVersion, eKind = append(eID, in.ID), append(eVersion, tr.Instance.Version), append(eKind, string(tr.Event.Kind))
			eStep, ePayload, eOrd = append(eStep, tr.Event.Step), append(ePayload, payload), append(eOrd, len(eOrd))
		}
	}
	return []any{
		id, status, curStep, ctxJSON, attempt, next, lastErr, lease, leaseExp, version, awaitCorr,
		awaitUntil, reply, compReason, updated, completed, read, held, pausedFrom, openStep,
		sID, sSeq, sName, sStatus, sAttempts, sCompAttempts, sOutput, sLastErr, sStarted, sCompleted, sCompensated,
		eID, eVersion, eKind, eStep, ePayload, eOrd,
	}
}

// readGroup reads sqlWriteGroup's result: every event of every instance, or
// an error naming the first instance that got fewer (its version was not
// the one read, so nothing of it was written).
func readGroup(br pgx.BatchResults, trss [][]saga.Transition) error {
	rows, err := br.Query()
	if err != nil {
		return fmt.Errorf("pgjournal: write a group of %d instances: %w", len(trss), err)
	}
	got := make(map[uuid.UUID]int, len(trss))
	var id uuid.UUID
	for rows.Next() {
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return fmt.Errorf("pgjournal: write a group of %d instances: %w", len(trss), err)
		}
		got[id]++
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("pgjournal: write a group of %d instances: %w", len(trss), err)
	}
	for _, trs := range trss {
		if in := trs[0].Instance; got[in.ID] != len(trs) {
			return fmt.Errorf("pgjournal: write %s: instance changed under its row lock (version %d expected): nothing was written", in.ID, in.Version-1)
		}
	}
	return nil
}

// jsonBytes is jsonArg for a parameter array's element: nil is SQL NULL.
func jsonBytes(raw json.RawMessage) []byte {
	if len(raw) == 0 {
		return nil
	}
	return raw
}

// jsonArg passes absent JSON as SQL NULL.
func jsonArg(raw json.RawMessage) any {
	if len(raw) == 0 {
		return nil
	}
	return []byte(raw)
}

// Get implements saga.Journal.
func (j *Journal) Get(ctx context.Context, id uuid.UUID) (saga.Instance, error) {
	var ir instanceRow
	err := j.q(ctx).QueryRow(ctx, sqlGet, id).Scan(ir.dest(nil)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return saga.Instance{}, saga.Errorf(saga.ErrNotFound, "saga instance %s does not exist", id)
	}
	if err != nil {
		return saga.Instance{}, fmt.Errorf("pgjournal: get %s: %w", id, err)
	}
	return ir.instance(), nil
}

// Steps implements saga.Journal.
func (j *Journal) Steps(ctx context.Context, id uuid.UUID) ([]saga.StepRecord, error) {
	rows, err := j.q(ctx).Query(ctx, sqlSteps, id)
	if err != nil {
		return nil, fmt.Errorf("pgjournal: steps of %s: %w", id, err)
	}
	defer rows.Close()
	found := false
	out := []saga.StepRecord{}
	for rows.Next() {
		var iid uuid.UUID
		var st stepRow
		if err := rows.Scan(append([]any{&iid}, st.dest()...)...); err != nil {
			return nil, fmt.Errorf("pgjournal: steps of %s: %w", id, err)
		}
		found = true
		if r := st.record(); r != nil {
			out = append(out, *r)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgjournal: steps of %s: %w", id, err)
	}
	if !found {
		return nil, saga.Errorf(saga.ErrNotFound, "saga instance %s does not exist", id)
	}
	return out, nil
}

// Load implements saga.Journal.
func (j *Journal) Load(ctx context.Context, id uuid.UUID) ([]saga.RecordedEvent, error) {
	rows, err := j.q(ctx).Query(ctx, sqlLoad, id)
	if err != nil {
		return nil, fmt.Errorf("pgjournal: load %s: %w", id, err)
	}
	defer rows.Close()
	found := false
	out := []saga.RecordedEvent{}
	for rows.Next() {
		var er eventRow
		if err := rows.Scan(er.dest()...); err != nil {
			return nil, fmt.Errorf("pgjournal: load %s: %w", id, err)
		}
		found = true
		ev, ok, err := er.event()
		if err != nil {
			return nil, fmt.Errorf("pgjournal: load %s: %w", id, err)
		}
		if ok {
			out = append(out, ev)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgjournal: load %s: %w", id, err)
	}
	if !found {
		return nil, saga.Errorf(saga.ErrNotFound, "saga instance %s does not exist", id)
	}
	return out, nil
}

// LoadSince implements saga.Journal: see sql.go for why the order is
// (xid, global_seq) below pg_snapshot_xmin.
func (j *Journal) LoadSince(ctx context.Context, after int64, limit int) ([]saga.RecordedEvent, error) {
	if limit <= 0 {
		return nil, saga.Errorf(saga.ErrInvalid, "load since: limit must be positive, got %d", limit)
	}
	if after < 0 {
		return nil, saga.Errorf(saga.ErrInvalid, "load since: global sequence must not be negative, got %d", after)
	}
	var rows pgx.Rows
	var err error
	if after == 0 {
		rows, err = j.q(ctx).Query(ctx, sqlLoadFirst, limit)
	} else {
		rows, err = j.q(ctx).Query(ctx, sqlLoadAfter, after, limit)
	}
	if err != nil {
		return nil, fmt.Errorf("pgjournal: load since %d: %w", after, err)
	}
	defer rows.Close()
	out := []saga.RecordedEvent{}
	cursorFound := after == 0
	for rows.Next() {
		var exists bool
		var er eventRow
		if err := rows.Scan(append([]any{&exists}, er.dest()...)...); err != nil {
			return nil, fmt.Errorf("pgjournal: load since %d: %w", after, err)
		}
		cursorFound = cursorFound || exists
		ev, ok, err := er.event()
		if err != nil {
			return nil, fmt.Errorf("pgjournal: load since %d: %w", after, err)
		}
		if ok {
			out = append(out, ev)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgjournal: load since %d: %w", after, err)
	}
	if !cursorFound {
		return nil, saga.Errorf(saga.ErrNotFound, "load since: no event has global sequence %d", after)
	}
	return out, nil
}

// HeadSeq implements saga.Journal.
func (j *Journal) HeadSeq(ctx context.Context) (int64, error) {
	var head int64
	if err := j.q(ctx).QueryRow(ctx, sqlHeadSeq).Scan(&head); err != nil {
		return 0, fmt.Errorf("pgjournal: head sequence: %w", err)
	}
	return head, nil
}
