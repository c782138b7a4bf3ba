package saga

import (
	"context"
	"encoding/json"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Instance is the projection of one saga instance: the saga_instances row.
type Instance struct {
	ID             uuid.UUID
	TenantID       uuid.UUID
	WorkspaceID    uuid.NullUUID
	SagaName       string
	SagaVersion    int
	Status         Status
	CurrentStep    int
	TriggerEventID uuid.UUID
	CorrelationID  uuid.NullUUID
	// Context is the saga's JSON state, passed from step to step.
	Context        json.RawMessage
	Attempt        int
	NextAttemptAt  time.Time
	TimeoutAt      *time.Time
	LastError      string
	LeaseID        uuid.NullUUID
	LeaseExpiresAt *time.Time
	// Version is the version of the newest journal event of this instance
	// (0 when it has none).
	Version int64
	// AwaitingCorrelationID is set while the current step waits for a reply.
	AwaitingCorrelationID uuid.NullUUID
	AwaitingUntil         *time.Time
	// Reply is the payload of a reply delivered to the waiting step and not
	// yet consumed by the runner.
	Reply              json.RawMessage
	CompensationReason string
	CreatedAt          time.Time
	UpdatedAt          time.Time
	CompletedAt        *time.Time
	// TraceParent is the W3C traceparent of the span that started the
	// instance: its steps' spans are its children ("" when none).
	TraceParent string
	// HeldSince is when the current run of failures that never count
	// (ClassOperator, ClassTransient) began; nil when the last attempt
	// did not fail that way.
	HeldSince *time.Time
	// PausedFrom is the status a PAUSED instance was paused in, to which
	// RequestResume returns it; empty when it is not paused.
	PausedFrom Status
	// OpenStep is the step the lease holder may be running an attempt of
	// (saga_instances.open_step), nil when none. An attempt can act outside
	// the database (a call out) and then lose its lease before its
	// step_failed commits, and nothing may be written without the lease:
	// this is what remembers it, at no cost to a step's run. The claim
	// opens the current step of a RUNNING instance that neither waits nor
	// holds a reply, step_completed and step_skipped open the next one
	// (the holder goes on without a claim), and the events after which the
	// holder runs no attempt, and Release, close it. Events that revoke the
	// lease (a person's, a reply) keep it: the attempt they cut short may
	// have acted. A claim that finds it set keeps it, and reports it in
	// InterruptedStep.
	OpenStep *int
	// InterruptedStep is set only on the instances ClaimPending returns:
	// the step the previous lease holder left open (OpenStep as the claim
	// found it), whose attempt may have acted without a record; nil when
	// none. The claimer appends step_interrupted for it before anything
	// else: until then every claim reports it again.
	InterruptedStep *int
}

// StepRecord is one saga_steps row: how a step of an instance went.
type StepRecord struct {
	Sequence             int
	Name                 string
	Status               StepStatus
	Attempts             int
	CompensationAttempts int
	Output               json.RawMessage
	LastError            string
	StartedAt            *time.Time
	CompletedAt          *time.Time
	CompensatedAt        *time.Time
}

// EventKind names a journal event. Each kind has one effect on the projection,
// applied by Advance, the same in every Journal implementation.
type EventKind string

const (
	// EventStepCompleted: step Step committed; CurrentStep moves past it,
	// State becomes the instance context, Attempt resets.
	EventStepCompleted EventKind = "step_completed"
	// EventStepFailed: an attempt of step Step failed with Error; it is
	// retried RetryIn from now. The step may have acted (a timeout).
	EventStepFailed EventKind = "step_failed"
	// EventStepSkipped: step Step decided not to act (Skip, with Reason);
	// CurrentStep moves past it and it is never compensated.
	EventStepSkipped EventKind = "step_skipped"
	// EventStepWaiting: step Step waits, acting on nothing, until Until
	// (WaitUntil); the instance is due then, and the step completes.
	EventStepWaiting EventKind = "step_waiting"
	// EventStepAwaiting: step Step acted (emitted a command) and waits for a
	// reply correlated by CorrelationID for at most AwaitFor.
	EventStepAwaiting EventKind = "step_awaiting"
	// EventReplyReceived: written by the correlator (not fenced: it revokes
	// the lease) when a reply reaches a waiting step.
	EventReplyReceived EventKind = "reply_received"
	// EventCompensationStarted: RUNNING -> COMPENSATING, starting at step
	// Step (the newest step that completed or may have acted), for Reason.
	EventCompensationStarted EventKind = "compensation_started"
	// EventStepCompensated: step Step's compensation committed; CurrentStep
	// moves to the step below.
	EventStepCompensated EventKind = "step_compensated"
	// EventCompensationSkipped: step Step has nothing to undo (no Compensate,
	// or it never ran); its status is left as it is.
	EventCompensationSkipped EventKind = "compensation_skipped"
	// EventCompensationFailed: an attempt of step Step's compensation failed
	// with Error; it is retried RetryIn from now.
	EventCompensationFailed EventKind = "compensation_failed"
	// EventRetryRequested: a person asked to resume the instance (Reason,
	// Actor). Not fenced: it revokes any lease.
	EventRetryRequested EventKind = "retry_requested"
	// EventCancelRequested: a person asked a RUNNING instance to compensate.
	EventCancelRequested EventKind = "cancel_requested"
	// EventPaused: a person paused a RUNNING or COMPENSATING instance
	// (Reason, Actor). Not fenced: it revokes any lease.
	EventPaused EventKind = "paused"
	// EventResumed: a person resumed a PAUSED instance (Reason, Actor): it
	// continues where it stood.
	EventResumed EventKind = "resumed"
	// EventUpgraded: a person moved the instance to another version of its
	// saga (Reason says from and to, and why; Actor who). Written by the
	// upgrade (saga/admin) under the row lock, not through Advance: it
	// changes only the version.
	EventUpgraded EventKind = "upgraded"
	// EventRestarted: a person started a new attempt of a FAILED or
	// COMPENSATED instance from step Step (Reason, Actor): RUNNING again at
	// that step, the earlier steps' records and outputs kept.
	EventRestarted EventKind = "restarted"
	// EventStepInterrupted: the previous lease holder left step Step open
	// (Instance.InterruptedStep): its lease expired or was revoked while an
	// attempt of the step may have been running, so the step may have
	// acted, and it is compensated as one that did. Written by the next
	// holder, fenced by its lease, before anything else; it changes no
	// status.
	EventStepInterrupted EventKind = "step_interrupted"
	// Terminal events, appended by MarkTerminal.
	EventCompleted   EventKind = "completed"
	EventCompensated EventKind = "compensated"
	EventFailed      EventKind = "failed"
	EventTimedOut    EventKind = "timed_out"
)

// Event is one journal entry as a writer submits it.
type Event struct {
	Kind EventKind `json:"kind"`
	// Step is the index of the step concerned (0-based); -1 when none.
	Step     int    `json:"step"`
	StepName string `json:"step_name,omitempty"`
	// State replaces the instance context when set.
	State json.RawMessage `json:"state,omitempty"`
	// Output is stored as the step's output (saga_steps.output).
	Output        json.RawMessage `json:"output,omitempty"`
	Error         string          `json:"error,omitempty"`
	RetryIn       time.Duration   `json:"retry_in,omitempty"`
	CorrelationID uuid.UUID       `json:"correlation_id,omitzero"`
	AwaitFor      time.Duration   `json:"await_for,omitempty"`
	// Until is the end of a step_waiting's wait.
	Until  time.Time `json:"until,omitzero"`
	Reason string    `json:"reason,omitempty"`
	Actor  string    `json:"actor,omitempty"`
	// Class is the class of a step_failed's or compensation_failed's
	// error when it holds the instance (ClassOperator, ClassTransient):
	// such a failure does not count as an attempt. Empty for ClassStep.
	Class ErrorClass `json:"class,omitempty"`
}

// RecordedEvent is an event as the journal stored it.
type RecordedEvent struct {
	InstanceID uuid.UUID
	Version    int64
	GlobalSeq  int64
	Event
	CreatedAt time.Time
}

// Journal stores saga instances as an append-only event log plus a mutable
// projection, with lease fencing. Every fenced write matches (id, lease_id,
// lease_expires_at >= now) on the journal's one clock; a stale writer changes
// nothing and gets ErrLeaseLost (Append) or false (Heartbeat, MarkTerminal).
//
// The PostgreSQL implementation joins the caller's transaction when the
// context carries one (ContextWithTx), so that a step's writes, its outbox
// rows and its journal entry commit together.
type Journal interface {
	// Enqueue inserts a RUNNING instance with no events. A duplicate id, or
	// a second start of one saga version by one trigger event, is
	// ErrConflict; an instance that does not start clean is ErrInvalid
	// (CheckNew).
	Enqueue(ctx context.Context, inst Instance) error
	// ClaimPending leases up to batchSize due instances (RUNNING or
	// COMPENSATING, next_attempt_at <= now, no live lease), each under a
	// fresh lease id returned in Instance.LeaseID, with its open step as
	// ClaimOpenStep says: a step the previous holder left open is kept and
	// reported in Instance.InterruptedStep.
	ClaimPending(ctx context.Context, batchSize int, leaseDuration time.Duration) ([]Instance, error)
	// Append validates ev against the projection (Advance), applies it and
	// stores it; it returns the new version. Fenced by the lease.
	Append(ctx context.Context, instanceID, leaseID uuid.UUID, ev Event) (int64, error)
	// Heartbeat extends a live lease to now + d. (false, nil) for a stale
	// lease and for an unknown instance alike; d under a microsecond on a
	// live lease is ErrInvalid.
	Heartbeat(ctx context.Context, instanceID, leaseID uuid.UUID, d time.Duration) (bool, error)
	// MarkTerminal moves the instance to a terminal status, appends the
	// matching terminal event and releases the lease, atomically. Fenced:
	// (false, nil) for a stale lease or an unknown instance; ErrInvalid for a
	// non-terminal status or an illegal transition.
	MarkTerminal(ctx context.Context, instanceID, leaseID uuid.UUID, final Status, reason string) (bool, error)
	// Get returns the projection. Unknown → ErrNotFound.
	Get(ctx context.Context, instanceID uuid.UUID) (Instance, error)
	// Steps returns the instance's step records ordered by sequence.
	Steps(ctx context.Context, instanceID uuid.UUID) ([]StepRecord, error)
	// Load returns the instance's history in version order: ErrNotFound for an
	// unknown instance, an empty non-nil slice for one with no events.
	Load(ctx context.Context, instanceID uuid.UUID) ([]RecordedEvent, error)
	// LoadSince returns up to limit events that follow the event whose
	// GlobalSeq is after (0: from the start), in commit order, never skipping
	// an event that commits late. A tailer passes the GlobalSeq of the last
	// event it received. Commit order is global_seq order except where
	// transactions interleave (then an event with a lower GlobalSeq that
	// committed later comes later); an instance's events always come in
	// version order. limit <= 0 or after < 0 → ErrInvalid; an after that
	// names no event → ErrNotFound; caught up → empty non-nil slice.
	LoadSince(ctx context.Context, after int64, limit int) ([]RecordedEvent, error)
	// HeadSeq returns the GlobalSeq of the last event LoadSince can return
	// now (0 when there is none): a tailer whose cursor equals it is caught
	// up.
	HeadSeq(ctx context.Context) (int64, error)

	// DeliverReply records a reply for the RUNNING (or PAUSED) instance waiting on
	// correlationID (reply_received, which ends the wait): not fenced, it
	// revokes any lease so that the instance is claimed again at once and a
	// runner still working on the wait cannot commit. It returns the
	// instance id; no instance waiting on correlationID (a late or unknown
	// reply) → ErrNotFound; more than one → ErrConflict. The correlator
	// delivers a batch's replies with its own set-based SQL to the same
	// effect; this is the one-at-a-time form.
	DeliverReply(ctx context.Context, correlationID uuid.UUID, reply json.RawMessage, actor string) (uuid.UUID, error)
	// RequestRetry resumes an instance where it stands (retry_requested):
	// RUNNING and COMPENSATING instances are due now with their attempt
	// counters reset, a FAILED one compensates again. Not fenced: it revokes
	// any lease. Unknown → ErrNotFound; a COMPLETED, COMPENSATED or
	// TIMED_OUT instance → ErrInvalid.
	RequestRetry(ctx context.Context, instanceID uuid.UUID, reason, actor string) error
	// RequestCancel makes a RUNNING instance compensate from where it stands
	// (cancel_requested). Not fenced: it revokes any lease. Unknown →
	// ErrNotFound; not RUNNING → ErrInvalid.
	RequestCancel(ctx context.Context, instanceID uuid.UUID, reason, actor string) error
	// RequestPause pauses a RUNNING or COMPENSATING instance (paused): it
	// becomes PAUSED, is never claimed, and keeps everything else (its
	// step, attempt, next_attempt_at, wait and concurrency key). Not
	// fenced: it revokes any lease, so a runner working on it cannot
	// commit. Unknown → ErrNotFound; any other status → ErrInvalid.
	RequestPause(ctx context.Context, instanceID uuid.UUID, reason, actor string) error
	// RequestResume returns a PAUSED instance to the status it was paused
	// in (resumed), due when it was due: a wait or a reply timeout that
	// passed meanwhile applies at once. Unknown → ErrNotFound; not PAUSED →
	// ErrInvalid.
	RequestResume(ctx context.Context, instanceID uuid.UUID, reason, actor string) error
	// RequestRestart starts a new attempt of a FAILED or COMPENSATED
	// instance from step (restarted): RUNNING at that step, attempt 0, due
	// now, the end and the compensation's reason cleared; the step records
	// stay (a step run again moves from where its record stands). Which
	// step may be chosen is the caller's decision (saga/admin checks that
	// nothing before it was undone and nothing from it on is still in
	// effect). Unknown → ErrNotFound; another status → ErrInvalid.
	RequestRestart(ctx context.Context, instanceID uuid.UUID, step int, reason, actor string) error
}

// DueReporter is implemented by journals that can say when the next
// RUNNING or COMPENSATING instance falls due: an idle runner then sleeps no
// longer than that, so that a timer (a wait step, a reply timeout, a retry)
// fires on time although the poll interval has grown.
type DueReporter interface {
	// NextDue returns how long from the journal's now until the earliest
	// next_attempt_at still in the future; false when there is none.
	NextDue(ctx context.Context) (time.Duration, bool, error)
}

// RateTaker is implemented by journals that keep step rate limits for every
// runner that shares them (Step.Rate). A turn belongs to an instance, not to
// a worker: an instance whose turn is later is given back, due at its turn,
// so that no worker waits for it.
type RateTaker interface {
	// TakeRateTurn gives the instance, held under leaseID, its turn of key,
	// whose turns are spaced by every. An instance without a turn reserves
	// the next free one. It returns 0 when the turn has come (it is used
	// up, and the lease is still held: run the step now); else how long
	// until the turn, and then the instance was given back due at it, with
	// its lease released and the turn kept for its next claim. A lease not
	// held is ErrLeaseLost and nothing is taken.
	TakeRateTurn(ctx context.Context, instanceID, leaseID uuid.UUID, key string, every time.Duration) (time.Duration, error)
}

// TerminalAppender is implemented by journals that can append an event and
// end the instance in one fenced mutation: the same effect as Append(ev)
// followed by MarkTerminal(final, reason) in one transaction, for the cost of
// one. A lease not held is ErrLeaseLost and nothing is written. The runner
// uses it for the write that ends a saga (its last step, its last
// compensation) when the journal has it.
type TerminalAppender interface {
	AppendTerminal(ctx context.Context, instanceID, leaseID uuid.UUID, ev Event, final Status, reason string) (int64, error)
}

// DecideAppend is what a journal decides for Append (final empty) or
// AppendTerminal (final set) on inst and cur, its current step's record, as
// read under the journal's lock at now: the lease fence, then the
// transitions to store, in order. Every journal decides through it, so that
// they cannot differ.
func DecideAppend(inst Instance, cur *StepRecord, leaseID uuid.UUID, ev Event, final Status, reason string, now time.Time) ([]Transition, error) {
	if !HoldsLease(inst, leaseID, now) {
		return nil, Errorf(ErrLeaseLost, "instance %s: lease %s is not held (expired, released or taken over); nothing was written", inst.ID, leaseID)
	}
	if !ev.Kind.Appendable() {
		return nil, Errorf(ErrInvalid, "instance %s: %q events are not appended with Append", inst.ID, ev.Kind)
	}
	var kind EventKind
	if final != "" {
		k, err := TerminalKind(final)
		if err != nil {
			return nil, err
		}
		kind = k
	}
	first, err := Advance(inst, cur, ev, now)
	if err != nil {
		return nil, err
	}
	if final == "" {
		return []Transition{first}, nil
	}
	// The terminal event sees the record of the step the first event left
	// current (none after a step_completed), as a second read would.
	end, err := Advance(first.Instance, CurrentRecord(first, cur), Event{Kind: kind, Step: -1, Reason: reason}, now)
	if err != nil {
		return nil, err
	}
	return []Transition{first, end}, nil
}

// GroupAppender is implemented by journals that append one entry for each
// of several instances in one go, each fenced by its own lease and decided as
// Append (or, with Final set, AppendTerminal) would decide it alone. In the
// caller's transaction (ContextWithTx) the entries commit with it; without
// one, the journal commits them in a transaction of its own. pgjournal does
// it in two round trips whatever the number of instances: the locking read of
// all of them (in id order, so that two groups never deadlock), then their
// writes. The runner's group commit uses it for steps that wrote nothing of
// their own.
type GroupAppender interface {
	// AppendGroup sets each entry's Err (nil: written) and Version. It
	// returns an error, with nothing written, when the group as a whole
	// failed (the database); without the caller's transaction, an error
	// after the COMMIT was sent leaves the outcome unknown.
	AppendGroup(ctx context.Context, entries []GroupEntry) error
}

// CheckGroup refuses a group that names an instance twice: its entries
// would be decided against one read. Journals call it first.
func CheckGroup(entries []GroupEntry) error {
	seen := make(map[uuid.UUID]struct{}, len(entries))
	for _, e := range entries {
		if _, dup := seen[e.InstanceID]; dup {
			return Errorf(ErrInvalid, "AppendGroup: instance %s appears twice in one group; append its entries one after the other", e.InstanceID)
		}
		seen[e.InstanceID] = struct{}{}
	}
	return nil
}

// GroupHeartbeater is implemented by journals that extend several leases in
// one statement. Unlike Heartbeat it never waits for a row lock: a row
// another transaction holds locked (the caller's own group commit, mostly)
// is reported LeaseBusy, neither extended nor refused; no claimer can take
// a locked row meanwhile, and every write stays fenced by the lease.
type GroupHeartbeater interface {
	// HeartbeatGroup returns one state per lease, in order.
	HeartbeatGroup(ctx context.Context, leases []LeaseRef, d time.Duration) ([]LeaseState, error)
}

// LeaseRef names a lease: the instance and the lease id its claim gave.
type LeaseRef struct {
	InstanceID, LeaseID uuid.UUID
}

// LeaseState is what HeartbeatGroup did with one lease.
type LeaseState int

const (
	// LeaseRefused: the lease is not held (expired, released, taken over).
	LeaseRefused LeaseState = iota
	// LeaseExtended: held, and now expires d after the journal's clock.
	LeaseExtended
	// LeaseBusy: the instance's row is locked by a transaction; its lease
	// was held as last committed, and was not extended.
	LeaseBusy
)

// GroupEntry is one instance's part of AppendGroup.
type GroupEntry struct {
	InstanceID, LeaseID uuid.UUID
	Event               Event
	// Final, when not empty, ends the instance in that status (with
	// Reason) after Event, as AppendTerminal does.
	Final  Status
	Reason string

	// Err is the entry's own refusal, as Append would return it: an error
	// wrapping ErrLeaseLost, ErrNotFound or ErrInvalid; nothing of this
	// entry was written. Version is the instance's new version when written.
	Err     error
	Version int64
}

// CurrentRecord is the step record of tr's new current step, given prev, the
// record of the step that was current before tr: tr's own step record when
// it concerns that step, prev when prev is that step's, else none. Journals
// use it to apply a second event after tr without reading back.
func CurrentRecord(tr Transition, prev *StepRecord) *StepRecord {
	cur := tr.Instance.CurrentStep
	switch {
	case tr.Step != nil && tr.Step.Sequence == cur:
		return tr.Step
	case prev != nil && prev.Sequence == cur:
		return prev
	}
	return nil
}

type txKey struct{}

// ContextWithTx returns a context that carries tx: journal calls made with it
// run inside tx instead of opening their own transaction.
func ContextWithTx(ctx context.Context, tx pgx.Tx) context.Context {
	return context.WithValue(ctx, txKey{}, tx)
}

// TxFromContext returns the transaction carried by ctx, if any.
func TxFromContext(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok && tx != nil
}
