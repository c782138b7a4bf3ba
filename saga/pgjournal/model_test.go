package pgjournal_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"pgregory.net/rapid"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/journaltest"
	"github.com/compensa/compensa/saga/memjournal"
	"github.com/compensa/compensa/saga/pgjournal"
	"github.com/compensa/compensa/test/pgtest"
)

// TestModelAgainstMemory drives the memory reference and the PostgreSQL
// journal with the same random operations on the same clock, and requires
// identical answers: the same error kinds, the same projections, steps and
// histories, the same tail. Lease ids differ (each journal mints its own);
// the model pairs them by claim and checks that the pairing holds.
func TestModelAgainstMemory(t *testing.T) {
	db := pgtest.NewDB(t)
	ctx := context.Background()
	rapid.Check(t, func(rt *rapid.T) {
		if _, err := db.Pool.Exec(ctx, `TRUNCATE saga_events, saga_steps, saga_instances RESTART IDENTITY CASCADE`); err != nil {
			rt.Fatalf("reset: %v", err)
		}
		clock := journaltest.NewClock(journaltest.Epoch)
		pg, err := pgjournal.New(db.Pool, &pgjournal.Config{Now: clock.PtrNow})
		if err != nil {
			rt.Fatal(err)
		}
		m := &model{
			mem: memjournal.New(clock.Now), pg: pg, clock: clock,
			ids:      []uuid.UUID{uuid.New(), uuid.New(), uuid.New()},
			triggers: []uuid.UUID{uuid.New(), uuid.New()},
			corrs:    []uuid.UUID{uuid.New(), uuid.New()},
			memToPG:  map[uuid.UUID]uuid.UUID{},
			versions: map[uuid.UUID]int64{},
		}
		// Start with every instance enqueued, so that most actions reach
		// the state machine instead of ErrNotFound.
		for i, id := range m.ids {
			inst := saga.Instance{ID: id, TenantID: m.ids[0], SagaName: "model", SagaVersion: 1,
				TriggerEventID: uuid.New(), Context: json.RawMessage(fmt.Sprintf(`{"i": %d}`, i))}
			sameErr(rt, "enqueue", m.mem.Enqueue(ctx, inst), m.pg.Enqueue(ctx, inst))
		}
		m.claim(rt, 2, time.Minute)
		actions := rapid.StateMachineActions(m)
		// rapid picks actions evenly: weight the runner-like Step so that
		// sequences reach compensation and terminal states.
		actions["Step2"], actions["Step3"], actions["Step4"] = m.Step, m.Step, m.Step
		rt.Repeat(actions)
	})
}

type model struct {
	mem   *memjournal.Journal
	pg    *pgjournal.Journal
	clock *journaltest.Clock

	ids, triggers, corrs []uuid.UUID
	// leases pairs each memory lease with the PostgreSQL lease of the same
	// claim; foreign is a lease neither journal issued.
	leases  [][2]uuid.UUID
	memToPG map[uuid.UUID]uuid.UUID
	// versions are the versions whose steps and history Check compared.
	versions map[uuid.UUID]int64
}

var ctx = context.Background()

// kind names the error kind for comparison; anything else fails the test.
func kind(t *rapid.T, err error) string {
	for _, k := range []error{saga.ErrNotFound, saga.ErrConflict, saga.ErrInvalid, saga.ErrLeaseLost} {
		if errors.Is(err, k) {
			return k.Error()
		}
	}
	if err != nil {
		t.Fatalf("error of no kind: %v", err)
	}
	return "ok"
}

func sameErr(t *rapid.T, what string, em, ep error) {
	if a, b := kind(t, em), kind(t, ep); a != b {
		t.Fatalf("%s: memory %q (%v), PostgreSQL %q (%v)", what, a, em, b, ep)
	}
}

func (m *model) id(t *rapid.T) uuid.UUID { return rapid.SampledFrom(m.ids).Draw(t, "instance") }

// lease draws a pair of leases: mostly the instance's current one, else one
// of a past claim, else one neither journal issued.
func (m *model) lease(t *rapid.T, id uuid.UUID) (mem, pg uuid.UUID) {
	switch rapid.IntRange(0, 9).Draw(t, "which lease") {
	case 0:
		u := uuid.New()
		return u, u
	case 1, 2:
		if len(m.leases) > 0 {
			p := rapid.SampledFrom(m.leases).Draw(t, "past lease")
			return p[0], p[1]
		}
	}
	if inst, err := m.mem.Get(ctx, id); err == nil && inst.LeaseID.Valid {
		return inst.LeaseID.UUID, m.memToPG[inst.LeaseID.UUID]
	}
	u := uuid.New()
	return u, u
}

// pick draws mostly from good and now and then from bad: random operations
// that are nearly all refused would test only the refusals.
func pick[T any](t *rapid.T, label string, good, bad []T) T {
	if len(bad) > 0 && rapid.IntRange(0, 9).Draw(t, label+" bad") == 0 {
		return rapid.SampledFrom(bad).Draw(t, label)
	}
	return rapid.SampledFrom(good).Draw(t, label)
}

var (
	goodDurations = []time.Duration{time.Microsecond, 2500 * time.Nanosecond, time.Second, 5 * time.Second}
	badDurations  = []time.Duration{0, 999 * time.Nanosecond, -time.Second}
)

func (m *model) Enqueue(t *rapid.T) {
	inst := saga.Instance{
		ID: m.id(t), TenantID: m.ids[0], SagaName: "model",
		SagaVersion:    pick(t, "version", []int{1, 2}, []int{0}),
		TriggerEventID: rapid.SampledFrom(m.triggers).Draw(t, "trigger"),
		Context:        raw(pick(t, "context", []string{"", `{"a": 1}`, `[1,2]`}, []string{`{bad`, `"\u0000"`})),
	}
	if off := rapid.SampledFrom([]time.Duration{0, -time.Second, 1500 * time.Nanosecond, time.Second}).Draw(t, "next"); off != 0 {
		inst.NextAttemptAt = m.clock.Now().Add(off)
	}
	sameErr(t, "enqueue", m.mem.Enqueue(ctx, inst), m.pg.Enqueue(ctx, inst))
}

func (m *model) Claim(t *rapid.T) {
	n := pick(t, "batch", []int{1, 2, 3}, []int{0, -1})
	d := pick(t, "lease duration", []time.Duration{time.Minute, 5 * time.Second},
		[]time.Duration{time.Microsecond, 2500 * time.Nanosecond, 0, -time.Second})
	m.claim(t, n, d)
}

func (m *model) claim(t *rapid.T, n int, d time.Duration) {
	rm, em := m.mem.ClaimPending(ctx, n, d)
	rp, ep := m.pg.ClaimPending(ctx, n, d)
	sameErr(t, "claim", em, ep)
	if len(rm) != len(rp) {
		t.Fatalf("claim: memory %d instances, PostgreSQL %d", len(rm), len(rp))
	}
	for i := range rm {
		if rm[i].ID != rp[i].ID {
			t.Fatalf("claim #%d: memory %s, PostgreSQL %s", i, rm[i].ID, rp[i].ID)
		}
		m.leases = append(m.leases, [2]uuid.UUID{rm[i].LeaseID.UUID, rp[i].LeaseID.UUID})
		m.memToPG[rm[i].LeaseID.UUID] = rp[i].LeaseID.UUID
		m.sameInstance(t, "claimed", rm[i], rp[i])
	}
}

func (m *model) Append(t *rapid.T) {
	id := m.id(t)
	lm, lp := m.lease(t, id)
	ev := m.event(t, id)
	vm, em := m.mem.Append(ctx, id, lm, ev)
	vp, ep := m.pg.Append(ctx, id, lp, ev)
	sameErr(t, fmt.Sprintf("append %s", ev.Kind), em, ep)
	if vm != vp {
		t.Fatalf("append: memory version %d, PostgreSQL %d", vm, vp)
	}
}

func (m *model) event(t *rapid.T, id uuid.UUID) saga.Event {
	kinds := []saga.EventKind{saga.EventStepCompleted, saga.EventStepCompleted, saga.EventStepFailed, saga.EventStepAwaiting,
		saga.EventCompensationStarted, saga.EventStepCompensated, saga.EventStepCompensated, saga.EventCompensationSkipped,
		saga.EventCompensationFailed, saga.EventCompleted, saga.EventRetryRequested, saga.EventStepInterrupted, "bogus"}
	step := rapid.IntRange(-1, 3).Draw(t, "step")
	if inst, err := m.mem.Get(ctx, id); err == nil && rapid.IntRange(0, 4).Draw(t, "at current step") > 0 {
		step = inst.CurrentStep
		if rapid.IntRange(0, 3).Draw(t, "below current") == 0 {
			step-- // compensation_started may name a lower step
		}
	}
	return saga.Event{
		Kind:          rapid.SampledFrom(kinds).Draw(t, "kind"),
		Step:          step,
		StepName:      rapid.SampledFrom([]string{"", "a", "b"}).Draw(t, "step name"),
		State:         raw(pick(t, "state", []string{"", `{"s": 1}`, `{"t": [1, {"u": null}]}`}, []string{`{bad`})),
		Output:        raw(pick(t, "output", []string{"", `"o"`, `{"b": 2, "a": 1}`}, []string{`"\u0000"`})),
		Error:         pick(t, "error", []string{"", "boom"}, []string{"nul\x00"}),
		RetryIn:       pick(t, "retry in", []time.Duration{0, 1500 * time.Nanosecond, time.Second}, []time.Duration{-time.Second}),
		CorrelationID: pick(t, "correlation", m.corrs, []uuid.UUID{uuid.Nil}),
		AwaitFor:      pick(t, "await for", goodDurations, badDurations),
		Reason:        rapid.SampledFrom([]string{"", "why"}).Draw(t, "reason"),
		Actor:         rapid.SampledFrom([]string{"", "runner"}).Draw(t, "actor"),
	}
}

func raw(s string) json.RawMessage {
	if s == "" {
		return nil
	}
	return json.RawMessage(s)
}

func (m *model) Heartbeat(t *rapid.T) {
	id := m.id(t)
	lm, lp := m.lease(t, id)
	d := pick(t, "duration", goodDurations, badDurations)
	om, em := m.mem.Heartbeat(ctx, id, lm, d)
	op, ep := m.pg.Heartbeat(ctx, id, lp, d)
	sameErr(t, "heartbeat", em, ep)
	if om != op {
		t.Fatalf("heartbeat: memory %t, PostgreSQL %t", om, op)
	}
}

func (m *model) MarkTerminal(t *rapid.T) {
	id := m.id(t)
	lm, lp := m.lease(t, id)
	st := pick(t, "status", []saga.Status{saga.StatusCompleted, saga.StatusCompensated, saga.StatusFailed, saga.StatusTimedOut},
		[]saga.Status{saga.StatusRunning, saga.StatusCompensating, "BOGUS"})
	reason := pick(t, "reason", []string{"", "done"}, []string{"x\x00"})
	om, em := m.mem.MarkTerminal(ctx, id, lm, st, reason)
	op, ep := m.pg.MarkTerminal(ctx, id, lp, st, reason)
	sameErr(t, "mark terminal", em, ep)
	if om != op {
		t.Fatalf("mark terminal: memory %t, PostgreSQL %t", om, op)
	}
}

func (m *model) Release(t *rapid.T) {
	id := m.id(t)
	lm, lp := m.lease(t, id)
	om, em := m.mem.Release(ctx, id, lm)
	op, ep := m.pg.Release(ctx, id, lp)
	sameErr(t, "release", em, ep)
	if om != op {
		t.Fatalf("release: memory %t, PostgreSQL %t", om, op)
	}
}

func (m *model) Pause(t *rapid.T) {
	id := m.id(t)
	sameErr(t, "pause", m.mem.RequestPause(ctx, id, "hold", "ops"), m.pg.RequestPause(ctx, id, "hold", "ops"))
}

func (m *model) Resume(t *rapid.T) {
	id := m.id(t)
	sameErr(t, "resume", m.mem.RequestResume(ctx, id, "go", "ops"), m.pg.RequestResume(ctx, id, "go", "ops"))
}

func (m *model) Retry(t *rapid.T) {
	id := m.id(t)
	reason := pick(t, "reason", []string{"", "ops"}, []string{"\xff"})
	sameErr(t, "retry", m.mem.RequestRetry(ctx, id, reason, "ops"), m.pg.RequestRetry(ctx, id, reason, "ops"))
}

func (m *model) Cancel(t *rapid.T) {
	id := m.id(t)
	sameErr(t, "cancel", m.mem.RequestCancel(ctx, id, "stop", "ops"), m.pg.RequestCancel(ctx, id, "stop", "ops"))
}

func (m *model) Reply(t *rapid.T) {
	corr := pick(t, "correlation", m.corrs, []uuid.UUID{uuid.New()})
	reply := raw(pick(t, "reply", []string{`{"ok": true}`, `[]`}, []string{"", `{bad`}))
	im, em := m.mem.DeliverReply(ctx, corr, reply, "correlator")
	ip, ep := m.pg.DeliverReply(ctx, corr, reply, "correlator")
	sameErr(t, "deliver reply", em, ep)
	if im != ip {
		t.Fatalf("deliver reply: memory %s, PostgreSQL %s", im, ip)
	}
}

func (m *model) Tick(t *rapid.T) {
	m.clock.Advance(pick(t, "tick", []time.Duration{time.Microsecond, 500 * time.Millisecond, time.Second},
		[]time.Duration{5*time.Second + time.Microsecond, time.Minute}))
}

// Step appends what a runner would: an event that fits the instance's
// status, at its current step, under its current lease. It takes random
// operations deep into the state machine (compensation, waits, retries).
func (m *model) Step(t *rapid.T) {
	id := m.id(t)
	inst, err := m.mem.Get(ctx, id)
	if err != nil || !inst.LeaseID.Valid {
		t.Skip("no lease to write under")
	}
	ev, ok := m.runnerEvent(t, inst)
	if !ok {
		t.Skip("terminal")
	}
	lp := m.memToPG[inst.LeaseID.UUID]
	vm, em := m.mem.Append(ctx, id, inst.LeaseID.UUID, ev)
	vp, ep := m.pg.Append(ctx, id, lp, ev)
	sameErr(t, fmt.Sprintf("append %s", ev.Kind), em, ep)
	if vm != vp {
		t.Fatalf("append: memory version %d, PostgreSQL %d", vm, vp)
	}
}

// runnerEvent draws an event a runner holding inst's lease could write
// next; false when inst has ended.
func (m *model) runnerEvent(t *rapid.T, inst saga.Instance) (saga.Event, bool) {
	var kinds []saga.EventKind
	switch inst.Status {
	case saga.StatusRunning:
		kinds = []saga.EventKind{saga.EventStepCompleted, saga.EventStepCompleted, saga.EventStepFailed, saga.EventStepAwaiting, saga.EventCompensationStarted}
	case saga.StatusCompensating:
		kinds = []saga.EventKind{saga.EventStepCompensated, saga.EventCompensationSkipped, saga.EventCompensationFailed}
	default:
		return saga.Event{}, false
	}
	if inst.OpenStep != nil {
		// What a runner writes first when its claim reports the step.
		kinds = append(kinds, saga.EventStepInterrupted)
	}
	ev := saga.Event{
		Kind: rapid.SampledFrom(kinds).Draw(t, "kind"), Step: inst.CurrentStep,
		StepName: fmt.Sprintf("s%d", inst.CurrentStep), Error: "e",
		Output:        raw(rapid.SampledFrom([]string{"", `{"b": 2, "a": 1}`}).Draw(t, "output")),
		RetryIn:       rapid.SampledFrom([]time.Duration{0, 1500 * time.Nanosecond, time.Second}).Draw(t, "retry in"),
		CorrelationID: rapid.SampledFrom(m.corrs).Draw(t, "correlation"),
		AwaitFor:      time.Second, Reason: "r",
	}
	if ev.Kind == saga.EventStepInterrupted {
		ev.Step = *inst.OpenStep
	}
	return ev, true
}

// AppendGroup appends an entry for each of two or three of the instances
// in one group, some with Final: mostly what a runner holding the lease
// would write (so that several entries of a group are written together, in
// the group's one statement), now and then a random lease or event. Every
// entry must be decided and written as the memory journal does.
func (m *model) AppendGroup(t *rapid.T) {
	ids := rapid.Permutation(m.ids).Draw(t, "group")[:rapid.IntRange(2, len(m.ids)).Draw(t, "group size")]
	var em, ep []saga.GroupEntry
	for _, id := range ids {
		var lm, lp uuid.UUID
		var ev saga.Event
		inst, err := m.mem.Get(ctx, id)
		ok := err == nil && inst.LeaseID.Valid && rapid.IntRange(0, 4).Draw(t, "as a runner") > 0
		if ok {
			lm, lp = inst.LeaseID.UUID, m.memToPG[inst.LeaseID.UUID]
			ev, ok = m.runnerEvent(t, inst)
		}
		if !ok {
			lm, lp = m.lease(t, id)
			ev = m.event(t, id)
		}
		final := rapid.SampledFrom([]saga.Status{"", "", saga.StatusCompleted, saga.StatusFailed}).Draw(t, "final")
		em = append(em, saga.GroupEntry{InstanceID: id, LeaseID: lm, Event: ev, Final: final, Reason: "r"})
		ep = append(ep, saga.GroupEntry{InstanceID: id, LeaseID: lp, Event: ev, Final: final, Reason: "r"})
	}
	sameErr(t, "append group", m.mem.AppendGroup(ctx, em), m.pg.AppendGroup(ctx, ep))
	for i := range em {
		sameErr(t, fmt.Sprintf("group entry %d (%s)", i, em[i].Event.Kind), em[i].Err, ep[i].Err)
		if em[i].Version != ep[i].Version {
			t.Fatalf("group entry %d: memory version %d, PostgreSQL %d", i, em[i].Version, ep[i].Version)
		}
	}
}

func (m *model) Tail(t *rapid.T) {
	head, err := m.mem.HeadSeq(ctx)
	if err != nil {
		t.Fatal(err)
	}
	after := rapid.Int64Range(-1, head+1).Draw(t, "after")
	limit := rapid.IntRange(-1, 4).Draw(t, "limit")
	rm, em := m.mem.LoadSince(ctx, after, limit)
	rp, ep := m.pg.LoadSince(ctx, after, limit)
	sameErr(t, "load since", em, ep)
	if len(rm) != len(rp) {
		t.Fatalf("load since %d/%d: memory %d events, PostgreSQL %d", after, limit, len(rm), len(rp))
	}
	for i := range rm {
		m.sameEvent(t, "load since", rm[i], rp[i])
	}
}

// Check compares everything both journals hold after every action.
func (m *model) Check(t *rapid.T) {
	hm, _ := m.mem.HeadSeq(ctx)
	hp, err := m.pg.HeadSeq(ctx)
	if err != nil || hm != hp {
		t.Fatalf("head: memory %d, PostgreSQL %d (%v)", hm, hp, err)
	}
	for _, id := range m.ids {
		im, em := m.mem.Get(ctx, id)
		ip, ep := m.pg.Get(ctx, id)
		sameErr(t, "get", em, ep)
		if em != nil {
			continue
		}
		m.sameInstance(t, "get", im, ip)
		// Steps and history change only with the projection's version,
		// which Get just compared; read them again only then.
		if m.versions[id] == im.Version {
			continue
		}
		m.versions[id] = im.Version
		sm, _ := m.mem.Steps(ctx, id)
		sp, err := m.pg.Steps(ctx, id)
		if err != nil || canon(t, sm) != canon(t, sp) {
			t.Fatalf("steps of %s:\nmemory     %s\nPostgreSQL %s (%v)", id, canon(t, sm), canon(t, sp), err)
		}
		lm, _ := m.mem.Load(ctx, id)
		lp, err := m.pg.Load(ctx, id)
		if err != nil || len(lm) != len(lp) {
			t.Fatalf("load %s: memory %d events, PostgreSQL %d (%v)", id, len(lm), len(lp), err)
		}
		for i := range lm {
			m.sameEvent(t, "load", lm[i], lp[i])
		}
	}
}

func (m *model) sameInstance(t *rapid.T, what string, a, b saga.Instance) {
	if a.LeaseID.Valid != b.LeaseID.Valid || a.LeaseID.Valid && m.memToPG[a.LeaseID.UUID] != b.LeaseID.UUID {
		t.Fatalf("%s %s: memory lease %v, PostgreSQL lease %v: not the same claim", what, a.ID, a.LeaseID, b.LeaseID)
	}
	a.LeaseID, b.LeaseID = uuid.NullUUID{}, uuid.NullUUID{}
	if ca, cb := canon(t, a), canon(t, b); ca != cb {
		t.Fatalf("%s:\nmemory     %s\nPostgreSQL %s", what, ca, cb)
	}
}

func (m *model) sameEvent(t *rapid.T, what string, a, b saga.RecordedEvent) {
	if ca, cb := canon(t, a), canon(t, b); ca != cb {
		t.Fatalf("%s:\nmemory     %s\nPostgreSQL %s", what, ca, cb)
	}
}

// canon renders v as JSON with every embedded JSON value normalised (jsonb
// reorders keys and drops spacing) and times in UTC.
func canon(t *rapid.T, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var x any
	if err := json.Unmarshal(b, &x); err != nil {
		t.Fatal(err)
	}
	out, _ := json.Marshal(x)
	return string(out)
}
