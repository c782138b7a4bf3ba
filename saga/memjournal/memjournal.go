package memjournal

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
)

// Journal is an in-memory saga.Journal. The zero value is not usable; call
// New. It is safe for concurrent use.
type Journal struct {
	now func() time.Time

	mu        sync.Mutex
	instances map[uuid.UUID]*entry
	// active holds the RUNNING and COMPENSATING instances: the only ones
	// ClaimPending looks at.
	active   map[uuid.UUID]*entry
	triggers map[triggerKey]uuid.UUID
	// events holds every event in GlobalSeq order: events[i].GlobalSeq is
	// i+1, since nothing is ever rolled back here.
	events []saga.RecordedEvent
	// rates holds each rate key's next free turn and last run (TakeRateTurn).
	rates map[string]rateKey
}

type entry struct {
	inst  saga.Instance
	steps map[int]saga.StepRecord
	// seqs are the GlobalSeqs of the instance's events, in version order.
	seqs []int64
	// rateTurn is the rate turn the instance was given back with
	// (TakeRateTurn), zero when it holds none.
	rateTurn time.Time
}

// triggerKey: one instance per saga per trigger event, whatever the version
// (saga_trigger_once_uq in PostgreSQL, migration 0007).
type triggerKey struct {
	name    string
	trigger uuid.UUID
}

var _ saga.Journal = (*Journal)(nil)

// New returns an empty journal whose one clock is now (time.Now when nil).
// Tests inject a clock they can set, to cross a lease's expiry exactly.
func New(now func() time.Time) *Journal {
	if now == nil {
		now = time.Now
	}
	return &Journal{
		now:       now,
		instances: map[uuid.UUID]*entry{},
		active:    map[uuid.UUID]*entry{},
		triggers:  map[triggerKey]uuid.UUID{},
	}
}

func (j *Journal) clock() time.Time { return saga.Timestamp(j.now()) }

// Enqueue implements saga.Journal.
func (j *Journal) Enqueue(_ context.Context, inst saga.Instance) error {
	if err := saga.CheckNew(inst); err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, dup := j.instances[inst.ID]; dup {
		return saga.Errorf(saga.ErrConflict, "saga instance %s already exists", inst.ID)
	}
	key := triggerKey{inst.SagaName, inst.TriggerEventID}
	if other, dup := j.triggers[key]; dup {
		return saga.Errorf(saga.ErrConflict, "trigger event %s already started saga %s (instance %s)", inst.TriggerEventID, inst.SagaName, other)
	}
	now := j.clock()
	inst.Status = saga.StatusRunning
	if len(inst.Context) == 0 {
		inst.Context = json.RawMessage(`{}`)
	}
	if inst.NextAttemptAt.IsZero() {
		inst.NextAttemptAt = now
	}
	inst.NextAttemptAt = saga.Timestamp(inst.NextAttemptAt)
	if inst.TimeoutAt != nil {
		inst.TimeoutAt = ptr(saga.Timestamp(*inst.TimeoutAt))
	}
	inst.CreatedAt, inst.UpdatedAt = now, now
	e := &entry{inst: cloneInstance(inst), steps: map[int]saga.StepRecord{}}
	j.instances[inst.ID] = e
	j.active[inst.ID] = e
	j.triggers[key] = inst.ID
	return nil
}

// TakeRateTurn implements saga.RateTaker.
func (j *Journal) TakeRateTurn(_ context.Context, id, leaseID uuid.UUID, key string, every time.Duration) (time.Duration, error) {
	if every < time.Microsecond {
		return 0, saga.Errorf(saga.ErrInvalid, "rate turn: turns must be at least 1µs apart, got %s", every)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	now := j.clock()
	e, ok := j.instances[id]
	if !ok || !saga.HoldsLease(e.inst, leaseID, now) {
		return 0, saga.Errorf(saga.ErrLeaseLost, "instance %s: lease %s is not held; no rate turn was taken", id, leaseID)
	}
	if j.rates == nil {
		j.rates = map[string]rateKey{}
	}
	k := j.rates[key]
	var held *time.Time
	if !e.rateTurn.IsZero() {
		held = &e.rateTurn
	}
	turn, next, last, use := saga.NextRateTurn(now, held, k.next, k.last, every.Truncate(time.Microsecond))
	j.rates[key] = rateKey{next: next, last: last}
	if use {
		e.rateTurn = time.Time{}
		return 0, nil
	}
	e.rateTurn = turn
	e.inst.NextAttemptAt = turn
	e.inst.LeaseID = uuid.NullUUID{}
	e.inst.LeaseExpiresAt = nil
	// Given back before its attempt began.
	e.inst.OpenStep = nil
	return turn.Sub(now), nil
}

// rateKey is one rate key's state: its next free turn and when it last let
// a step run.
type rateKey struct {
	next time.Time
	last *time.Time
}

// NextDue implements saga.DueReporter.
func (j *Journal) NextDue(context.Context) (time.Duration, bool, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	now := saga.Timestamp(j.clock())
	var best time.Time
	for _, e := range j.active {
		if t := e.inst.NextAttemptAt; t.After(now) && (best.IsZero() || t.Before(best)) {
			best = t
		}
	}
	if best.IsZero() {
		return 0, false, nil
	}
	return best.Sub(now), true, nil
}

// ClaimPending implements saga.Journal: due instances in next_attempt_at
// order (then id), each under a fresh random lease until now+d, their open
// step as saga.ClaimOpenStep says.
func (j *Journal) ClaimPending(_ context.Context, batchSize int, d time.Duration) ([]saga.Instance, error) {
	if batchSize <= 0 {
		return nil, saga.Errorf(saga.ErrInvalid, "claim: batch size must be positive, got %d", batchSize)
	}
	if d < time.Microsecond {
		return nil, saga.Errorf(saga.ErrInvalid, "claim: lease duration must be at least 1µs, got %s", d)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	now := j.clock()
	// Keep the batchSize first due instances in (next_attempt_at, id)
	// order: a bounded insertion, since sorting every due instance on each
	// claim would make large tests quadratic.
	due := make([]*entry, 0, min(batchSize, len(j.active)))
	for _, e := range j.active {
		if !saga.Claimable(&e.inst, now) {
			continue
		}
		if len(due) == batchSize && !claimsBefore(e, due[len(due)-1]) {
			continue
		}
		i, _ := slices.BinarySearchFunc(due, e, func(a, b *entry) int {
			if claimsBefore(a, b) {
				return -1
			}
			return 1
		})
		if len(due) < batchSize {
			due = append(due, nil)
		}
		copy(due[i+1:], due[i:len(due)-1])
		due[i] = e
	}
	out := make([]saga.Instance, 0, len(due))
	expires := now.Add(d.Truncate(time.Microsecond))
	for _, e := range due {
		e.inst.LeaseID = uuid.NullUUID{UUID: uuid.New(), Valid: true}
		e.inst.LeaseExpiresAt = ptr(expires)
		var interrupted *int
		interrupted, e.inst.OpenStep = saga.ClaimOpenStep(e.inst)
		c := cloneInstance(e.inst)
		c.InterruptedStep = clonePtr(interrupted)
		out = append(out, c)
	}
	return out, nil
}

// claimsBefore orders due instances as ClaimPending takes them.
func claimsBefore(a, b *entry) bool {
	if c := a.inst.NextAttemptAt.Compare(b.inst.NextAttemptAt); c != 0 {
		return c < 0
	}
	return bytes.Compare(a.inst.ID[:], b.inst.ID[:]) < 0
}

// Append implements saga.Journal.
func (j *Journal) Append(_ context.Context, id, leaseID uuid.UUID, ev saga.Event) (int64, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.appendLocked(id, leaseID, ev, "", "")
}

// AppendTerminal implements saga.TerminalAppender: Append, then
// MarkTerminal, atomically.
func (j *Journal) AppendTerminal(_ context.Context, id, leaseID uuid.UUID, ev saga.Event, final saga.Status, reason string) (int64, error) {
	if final == "" {
		return 0, saga.Errorf(saga.ErrInvalid, "instance %s: AppendTerminal needs a terminal status", id)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.appendLocked(id, leaseID, ev, final, reason)
}

// AppendGroup implements saga.GroupAppender: each entry decided and applied
// as Append (or AppendTerminal) would, all under one lock.
func (j *Journal) AppendGroup(_ context.Context, entries []saga.GroupEntry) error {
	if err := saga.CheckGroup(entries); err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	for i := range entries {
		e := &entries[i]
		e.Version, e.Err = j.appendLocked(e.InstanceID, e.LeaseID, e.Event, e.Final, e.Reason)
	}
	return nil
}

// appendLocked decides (saga.DecideAppend) and applies one entry; j.mu is
// held.
func (j *Journal) appendLocked(id, leaseID uuid.UUID, ev saga.Event, final saga.Status, reason string) (int64, error) {
	e, ok := j.instances[id]
	if !ok {
		return 0, saga.Errorf(saga.ErrNotFound, "saga instance %s does not exist", id)
	}
	trs, err := saga.DecideAppend(e.inst, e.current(), leaseID, ev, final, reason, j.clock())
	if err != nil {
		return 0, err
	}
	for _, tr := range trs {
		j.apply(e, tr)
	}
	return trs[len(trs)-1].Instance.Version, nil
}

// Heartbeat implements saga.Journal.
func (j *Journal) Heartbeat(_ context.Context, id, leaseID uuid.UUID, d time.Duration) (bool, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	e, ok := j.instances[id]
	now := j.clock()
	if !ok || !saga.HoldsLease(e.inst, leaseID, now) {
		return false, nil
	}
	if d < time.Microsecond {
		return false, saga.Errorf(saga.ErrInvalid, "heartbeat: lease duration must be at least 1µs, got %s", d)
	}
	e.inst.LeaseExpiresAt = ptr(now.Add(d.Truncate(time.Microsecond)))
	return true, nil
}

// Release gives back the lease leaseID of instance id, which runs no
// attempt now: the lease and the open step are cleared, and the instance
// is claimable at once. (false, nil) when the lease is not held.
func (j *Journal) Release(_ context.Context, id, leaseID uuid.UUID) (bool, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	e, ok := j.instances[id]
	if !ok || !saga.HoldsLease(e.inst, leaseID, j.clock()) {
		return false, nil
	}
	e.inst.LeaseID = uuid.NullUUID{}
	e.inst.LeaseExpiresAt = nil
	e.inst.OpenStep = nil
	return true, nil
}

// MarkTerminal implements saga.Journal.
func (j *Journal) MarkTerminal(_ context.Context, id, leaseID uuid.UUID, final saga.Status, reason string) (bool, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	e, ok := j.instances[id]
	now := j.clock()
	if !ok || !saga.HoldsLease(e.inst, leaseID, now) {
		return false, nil
	}
	kind, err := saga.TerminalKind(final)
	if err != nil {
		return false, err
	}
	tr, err := saga.Advance(e.inst, e.current(), saga.Event{Kind: kind, Step: -1, Reason: reason}, now)
	if err != nil {
		return false, err
	}
	j.apply(e, tr)
	return true, nil
}

// RequestRetry implements saga.Journal.
func (j *Journal) RequestRetry(_ context.Context, id uuid.UUID, reason, actor string) error {
	return j.request(id, saga.Event{Kind: saga.EventRetryRequested, Step: -1, Reason: reason, Actor: actor})
}

// RequestCancel implements saga.Journal.
func (j *Journal) RequestCancel(_ context.Context, id uuid.UUID, reason, actor string) error {
	return j.request(id, saga.Event{Kind: saga.EventCancelRequested, Step: -1, Reason: reason, Actor: actor})
}

// RequestPause implements saga.Journal.
func (j *Journal) RequestPause(_ context.Context, id uuid.UUID, reason, actor string) error {
	return j.request(id, saga.Event{Kind: saga.EventPaused, Step: -1, Reason: reason, Actor: actor})
}

// RequestRestart implements saga.Journal.
func (j *Journal) RequestRestart(_ context.Context, id uuid.UUID, step int, reason, actor string) error {
	return j.request(id, saga.Event{Kind: saga.EventRestarted, Step: step, Reason: reason, Actor: actor})
}

// RequestResume implements saga.Journal.
func (j *Journal) RequestResume(_ context.Context, id uuid.UUID, reason, actor string) error {
	return j.request(id, saga.Event{Kind: saga.EventResumed, Step: -1, Reason: reason, Actor: actor})
}

func (j *Journal) request(id uuid.UUID, ev saga.Event) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	e, ok := j.instances[id]
	if !ok {
		return saga.Errorf(saga.ErrNotFound, "saga instance %s does not exist", id)
	}
	tr, err := saga.Advance(e.inst, e.current(), ev, j.clock())
	if err != nil {
		return err
	}
	j.apply(e, tr)
	return nil
}

// DeliverReply records reply for the RUNNING (or PAUSED) instance waiting
// on correlationID (a reply_received event) and revokes its lease. It returns
// the instance id: ErrNotFound when no instance waits on correlationID,
// ErrConflict when more than one does. It is what the correlator does in
// PostgreSQL, for tests that run on this journal.
func (j *Journal) DeliverReply(_ context.Context, correlationID uuid.UUID, reply json.RawMessage, actor string) (uuid.UUID, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	var found []*entry
	for _, e := range j.instances {
		if (e.inst.Status == saga.StatusRunning || e.inst.Status == saga.StatusPaused) && e.inst.AwaitingCorrelationID.Valid && e.inst.AwaitingCorrelationID.UUID == correlationID {
			found = append(found, e)
		}
	}
	switch len(found) {
	case 0:
		return uuid.Nil, saga.Errorf(saga.ErrNotFound, "no RUNNING instance waits on correlation id %s (a late or unknown reply)", correlationID)
	case 1:
	default:
		return uuid.Nil, saga.Errorf(saga.ErrConflict, "%d instances wait on correlation id %s", len(found), correlationID)
	}
	e := found[0]
	ev := saga.Event{Kind: saga.EventReplyReceived, Step: e.inst.CurrentStep, CorrelationID: correlationID, Output: reply, Actor: actor}
	tr, err := saga.Advance(e.inst, e.current(), ev, j.clock())
	if err != nil {
		return uuid.Nil, err
	}
	j.apply(e, tr)
	return e.inst.ID, nil
}

// Get implements saga.Journal.
func (j *Journal) Get(_ context.Context, id uuid.UUID) (saga.Instance, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	e, ok := j.instances[id]
	if !ok {
		return saga.Instance{}, saga.Errorf(saga.ErrNotFound, "saga instance %s does not exist", id)
	}
	return cloneInstance(e.inst), nil
}

// Steps implements saga.Journal.
func (j *Journal) Steps(_ context.Context, id uuid.UUID) ([]saga.StepRecord, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	e, ok := j.instances[id]
	if !ok {
		return nil, saga.Errorf(saga.ErrNotFound, "saga instance %s does not exist", id)
	}
	out := make([]saga.StepRecord, 0, len(e.steps))
	for _, s := range e.steps {
		out = append(out, cloneStep(s))
	}
	slices.SortFunc(out, func(a, b saga.StepRecord) int { return a.Sequence - b.Sequence })
	return out, nil
}

// Load implements saga.Journal.
func (j *Journal) Load(_ context.Context, id uuid.UUID) ([]saga.RecordedEvent, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	e, ok := j.instances[id]
	if !ok {
		return nil, saga.Errorf(saga.ErrNotFound, "saga instance %s does not exist", id)
	}
	out := make([]saga.RecordedEvent, 0, len(e.seqs))
	for _, seq := range e.seqs {
		out = append(out, cloneEvent(j.events[seq-1]))
	}
	return out, nil
}

// LoadSince implements saga.Journal.
func (j *Journal) LoadSince(_ context.Context, after int64, limit int) ([]saga.RecordedEvent, error) {
	if limit <= 0 {
		return nil, saga.Errorf(saga.ErrInvalid, "load since: limit must be positive, got %d", limit)
	}
	if after < 0 {
		return nil, saga.Errorf(saga.ErrInvalid, "load since: global sequence must not be negative, got %d", after)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if after > int64(len(j.events)) {
		return nil, saga.Errorf(saga.ErrNotFound, "load since: no event has global sequence %d (the head is %d)", after, len(j.events))
	}
	rest := j.events[after:]
	if len(rest) > limit {
		rest = rest[:limit]
	}
	out := make([]saga.RecordedEvent, 0, len(rest))
	for _, ev := range rest {
		out = append(out, cloneEvent(ev))
	}
	return out, nil
}

// HeadSeq implements saga.Journal.
func (j *Journal) HeadSeq(context.Context) (int64, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return int64(len(j.events)), nil
}

// current returns a copy of the current step's record, nil when it has none.
func (e *entry) current() *saga.StepRecord {
	s, ok := e.steps[e.inst.CurrentStep]
	if !ok {
		return nil
	}
	c := cloneStep(s)
	return &c
}

func (j *Journal) apply(e *entry, tr saga.Transition) {
	e.inst = cloneInstance(tr.Instance)
	if st := e.inst.Status; st == saga.StatusRunning || st == saga.StatusCompensating {
		j.active[e.inst.ID] = e
	} else {
		delete(j.active, e.inst.ID)
	}
	if tr.Step != nil {
		e.steps[tr.Step.Sequence] = cloneStep(*tr.Step)
	}
	ev := cloneEvent(tr.Event)
	ev.GlobalSeq = int64(len(j.events)) + 1
	j.events = append(j.events, ev)
	e.seqs = append(e.seqs, ev.GlobalSeq)
}

func ptr[T any](v T) *T { return &v }

func clonePtr[T any](t *T) *T {
	if t == nil {
		return nil
	}
	return ptr(*t)
}

func cloneRaw(r json.RawMessage) json.RawMessage {
	if r == nil {
		return nil
	}
	return append(json.RawMessage{}, r...)
}

// cloneInstance deep-copies, so that a caller never aliases the journal's
// state through a pointer or a slice.
func cloneInstance(i saga.Instance) saga.Instance {
	i.Context = cloneRaw(i.Context)
	i.Reply = cloneRaw(i.Reply)
	i.TimeoutAt = clonePtr(i.TimeoutAt)
	i.LeaseExpiresAt = clonePtr(i.LeaseExpiresAt)
	i.AwaitingUntil = clonePtr(i.AwaitingUntil)
	i.CompletedAt = clonePtr(i.CompletedAt)
	i.HeldSince = clonePtr(i.HeldSince)
	i.OpenStep = clonePtr(i.OpenStep)
	i.InterruptedStep = clonePtr(i.InterruptedStep)
	return i
}

func cloneStep(s saga.StepRecord) saga.StepRecord {
	s.Output = cloneRaw(s.Output)
	s.StartedAt = clonePtr(s.StartedAt)
	s.CompletedAt = clonePtr(s.CompletedAt)
	s.CompensatedAt = clonePtr(s.CompensatedAt)
	return s
}

func cloneEvent(e saga.RecordedEvent) saga.RecordedEvent {
	e.State = cloneRaw(e.State)
	e.Output = cloneRaw(e.Output)
	return e
}
