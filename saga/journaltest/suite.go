package journaltest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
)

// Run runs the conformance suite. newHarness must return a fresh, empty
// journal for each call; subtests run in parallel.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	cases := []struct {
		name string
		fn   func(t *testing.T, h Harness)
	}{
		{"Enqueue/StoresAndStamps", testEnqueueStores},
		{"Enqueue/DuplicateIDIsConflict", testEnqueueDuplicateID},
		{"Enqueue/DuplicateTriggerIsConflict", testEnqueueDuplicateTrigger},
		{"Enqueue/InvalidIsInvalid", testEnqueueInvalid},
		{"Get/UnknownIsNotFound", testGetUnknown},
		{"Steps/UnknownAndEmpty", testStepsUnknownAndEmpty},

		{"ClaimPending/InvalidArguments", testClaimInvalid},
		{"ClaimPending/DueOrderAndBatch", testClaimDueOrder},
		{"ClaimPending/FreshLeasePerInstancePerClaim", testClaimFreshLeases},
		{"ClaimPending/SkipsTerminalAndCompensatingIsDue", testClaimStatuses},

		{"Append/BeforeLeaseExpiry", boundary(-time.Microsecond, testAppendAt)},
		{"Append/ExactlyAtLeaseExpiry", boundary(0, testAppendAt)},
		{"Append/AfterLeaseExpiry", boundary(time.Microsecond, testAppendAt)},
		{"ClaimPending/BeforeLeaseExpiry", boundary(-time.Microsecond, testClaimAt)},
		{"ClaimPending/ExactlyAtLeaseExpiry", boundary(0, testClaimAt)},
		{"ClaimPending/AfterLeaseExpiry", boundary(time.Microsecond, testClaimAt)},
		{"Heartbeat/BeforeLeaseExpiry", boundary(-time.Microsecond, testHeartbeatAt)},
		{"Heartbeat/ExactlyAtLeaseExpiry", boundary(0, testHeartbeatAt)},
		{"Heartbeat/AfterLeaseExpiry", boundary(time.Microsecond, testHeartbeatAt)},
		{"MarkTerminal/BeforeLeaseExpiry", boundary(-time.Microsecond, testMarkTerminalAt)},
		{"MarkTerminal/ExactlyAtLeaseExpiry", boundary(0, testMarkTerminalAt)},
		{"MarkTerminal/AfterLeaseExpiry", boundary(time.Microsecond, testMarkTerminalAt)},

		{"Precedence/UnknownInstanceWithBadPayloadIsNotFound", testPrecedenceUnknown},
		{"Precedence/StaleLeaseWithBadPayloadIsLeaseLost", testPrecedenceStale},
		{"Append/WrongLeaseIsLeaseLost", testAppendWrongLease},
		{"Append/OnlyAppendableKinds", testAppendKinds},
		{"Append/IllegalTransitionChangesNothing", testAppendIllegal},
		{"Append/EventRoundTrip", testAppendRoundTrip},
		{"AppendGroup/EachEntryFencedAndDecidedAlone", testAppendGroup},
		{"Heartbeat/ExtendsFromNow", testHeartbeatExtends},
		{"MarkTerminal/ReleasesLeaseAndRecords", testMarkTerminal},
		{"MarkTerminal/NonTerminalAndIllegalAreInvalid", testMarkTerminalInvalid},
		{"RequestRetry/ResumesFailedCompensation", testRetryFailed},
		{"RequestRetry/RevokesLease", testRetryRevokes},
		{"RequestRetry/UnknownAndFinished", testRetryRefusals},
		{"RequestCancel/CompensatesFromCurrentStep", testCancel},
		{"RequestPause/NeverClaimedUntilResumed", testPauseResume},
		{"RequestPause/KeepsAReplyAndTheWait", testPauseKeepsReply},
		{"RequestPause/CompensatingResumesCompensating", testPauseCompensating},
		{"RequestRestart/NewAttemptFromAStep", testRestart},
		{"DeliverReply/WakesTheWaitingStep", testDeliverReply},
		{"Lifecycle/ForwardThenCompensate", testLifecycle},
		{"Append/SkipAndWait", testSkipAndWait},
		{"RateTurn/ReservedTurnsGiveInstancesBack", testRateTurns},

		{"OpenStep/ClaimOpensTheCurrentStep", testClaimOpensTheCurrentStep},
		{"OpenStep/LeftOpenIsReportedUntilRecorded", testLeftOpenIsReportedUntilRecorded},
		{"OpenStep/ReleaseClosesHeartbeatKeeps", testReleaseClosesHeartbeatKeeps},
		{"OpenStep/LeaseRevokingRequestsKeepIt", testLeaseRevokingRequestsKeepIt},
		{"OpenStep/SkipAfterInterruption", testSkipAfterInterruption},
		{"OpenStep/WaitsOpenNothing", testWaitsOpenNothing},
		{"OpenStep/RateGiveBackCloses", testRateGiveBackCloses},

		{"Load/UnknownAndEmpty", testLoadEdges},
		{"LoadSince/ArgumentsAndEmptyJournal", testLoadSinceArgs},
		{"LoadSince/PagesInOrderAndCatchesUp", testLoadSincePages},
		{"HeadSeq/FollowsAppends", testHeadSeq},

		{"Concurrency/ClaimsAreExclusiveAndStaleWritesRejected", testConcurrentClaims},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			if h.Journal == nil || h.Clock == nil {
				t.Fatal("journaltest: the harness needs a Journal and a Clock")
			}
			c.fn(t, h)
		})
	}
}

var ctx = context.Background()

const lease = 10 * time.Second

func newInstance() saga.Instance {
	return saga.Instance{
		ID:             uuid.New(),
		TenantID:       uuid.New(),
		SagaName:       "order",
		SagaVersion:    1,
		TriggerEventID: uuid.New(),
		Context:        json.RawMessage(`{"n": 1}`),
	}
}

func enqueue(t *testing.T, h Harness) saga.Instance {
	t.Helper()
	inst := newInstance()
	if err := h.Journal.Enqueue(ctx, inst); err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	return inst
}

func claim(t *testing.T, j saga.Journal, id uuid.UUID, d time.Duration) saga.Instance {
	t.Helper()
	got, err := j.ClaimPending(ctx, 1000, d)
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	for _, inst := range got {
		if inst.ID == id {
			return inst
		}
	}
	t.Fatalf("claim: instance %s not claimed (got %d others)", id, len(got))
	return saga.Instance{}
}

// started enqueues an instance and claims it: it returns the claimed
// projection, with its lease.
func started(t *testing.T, h Harness) saga.Instance {
	t.Helper()
	inst := enqueue(t, h)
	return claim(t, h.Journal, inst.ID, lease)
}

func get(t *testing.T, j saga.Journal, id uuid.UUID) saga.Instance {
	t.Helper()
	inst, err := j.Get(ctx, id)
	if err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	return inst
}

func appendOK(t *testing.T, j saga.Journal, inst saga.Instance, ev saga.Event) int64 {
	t.Helper()
	v, err := j.Append(ctx, inst.ID, inst.LeaseID.UUID, ev)
	if err != nil {
		t.Fatalf("append %s: %v", ev.Kind, err)
	}
	return v
}

func isKind(t *testing.T, what string, err, kind error) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("%s: error %v, want kind %q", what, err, kind)
	}
	if err.Error() == kind.Error() {
		t.Fatalf("%s: error %q says nothing a person can act on", what, err)
	}
}

func sameTime(t *testing.T, what string, got *time.Time, want time.Time) {
	t.Helper()
	if got == nil || !got.Equal(want) {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
}

// JSONEqual reports whether a and b hold the same JSON value (PostgreSQL's
// jsonb does not keep spacing or key order). Empty equals empty only.
func JSONEqual(a, b json.RawMessage) bool {
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

func testEnqueueStores(t *testing.T, h Harness) {
	now := h.Clock.Now()
	inst := newInstance()
	inst.WorkspaceID = uuid.NullUUID{UUID: uuid.New(), Valid: true}
	inst.CorrelationID = uuid.NullUUID{UUID: uuid.New(), Valid: true}
	deadline := now.Add(time.Hour + 1500*time.Nanosecond)
	inst.TimeoutAt = &deadline
	if err := h.Journal.Enqueue(ctx, inst); err != nil {
		t.Fatal(err)
	}
	got := get(t, h.Journal, inst.ID)
	if got.ID != inst.ID || got.TenantID != inst.TenantID || got.WorkspaceID != inst.WorkspaceID ||
		got.SagaName != "order" || got.SagaVersion != 1 || got.TriggerEventID != inst.TriggerEventID ||
		got.CorrelationID != inst.CorrelationID {
		t.Fatalf("identity not stored: %+v", got)
	}
	if got.Status != saga.StatusRunning || got.CurrentStep != 0 || got.Attempt != 0 || got.Version != 0 ||
		got.LeaseID.Valid || got.LeaseExpiresAt != nil || got.CompletedAt != nil || got.Reply != nil {
		t.Fatalf("a new instance must start clean: %+v", got)
	}
	if !JSONEqual(got.Context, inst.Context) {
		t.Fatalf("context %s, want %s", got.Context, inst.Context)
	}
	if !got.NextAttemptAt.Equal(now) || !got.CreatedAt.Equal(now) || !got.UpdatedAt.Equal(now) {
		t.Fatalf("times not from the journal clock %v: next %v created %v updated %v", now, got.NextAttemptAt, got.CreatedAt, got.UpdatedAt)
	}
	sameTime(t, "timeout_at (microseconds)", got.TimeoutAt, now.Add(time.Hour+time.Microsecond))

	// Defaults: empty context is {}, an explicit NextAttemptAt is kept.
	later := newInstance()
	later.Context = nil
	later.NextAttemptAt = now.Add(time.Minute)
	if err := h.Journal.Enqueue(ctx, later); err != nil {
		t.Fatal(err)
	}
	got = get(t, h.Journal, later.ID)
	if !JSONEqual(got.Context, json.RawMessage(`{}`)) || !got.NextAttemptAt.Equal(now.Add(time.Minute)) {
		t.Fatalf("defaults: context %s next %v", got.Context, got.NextAttemptAt)
	}
}

func testEnqueueDuplicateID(t *testing.T, h Harness) {
	inst := enqueue(t, h)
	again := newInstance()
	again.ID = inst.ID
	isKind(t, "duplicate id", h.Journal.Enqueue(ctx, again), saga.ErrConflict)
}

func testEnqueueDuplicateTrigger(t *testing.T, h Harness) {
	inst := enqueue(t, h)
	again := newInstance()
	again.TriggerEventID = inst.TriggerEventID
	isKind(t, "same saga and trigger", h.Journal.Enqueue(ctx, again), saga.ErrConflict)
	// Nor may another version of the saga: a trigger replayed after a new
	// version was deployed must not start the saga twice.
	again.SagaVersion = 2
	isKind(t, "other version, same trigger", h.Journal.Enqueue(ctx, again), saga.ErrConflict)
}

func testEnqueueInvalid(t *testing.T, h Harness) {
	for name, mutate := range map[string]func(*saga.Instance){
		"no id":            func(i *saga.Instance) { i.ID = uuid.Nil },
		"no name":          func(i *saga.Instance) { i.SagaName = "" },
		"version 0":        func(i *saga.Instance) { i.SagaVersion = 0 },
		"bad context":      func(i *saga.Instance) { i.Context = json.RawMessage(`{"a":`) },
		"not running":      func(i *saga.Instance) { i.Status = saga.StatusCompleted },
		"progress":         func(i *saga.Instance) { i.CurrentStep = 2 },
		"lease":            func(i *saga.Instance) { i.LeaseID = uuid.NullUUID{UUID: uuid.New(), Valid: true} },
		"NUL in name":      func(i *saga.Instance) { i.SagaName = "a\x00b" },
		"NUL in context":   func(i *saga.Instance) { i.Context = json.RawMessage(`{"a":"\u0000"}`) },
		"unconsumed reply": func(i *saga.Instance) { i.Reply = json.RawMessage(`1`) },
	} {
		inst := newInstance()
		mutate(&inst)
		isKind(t, name, h.Journal.Enqueue(ctx, inst), saga.ErrInvalid)
	}
	head, err := h.Journal.HeadSeq(ctx)
	if err != nil || head != 0 {
		t.Fatalf("refused enqueues left a trace: head %d, %v", head, err)
	}
}

func testGetUnknown(t *testing.T, h Harness) {
	_, err := h.Journal.Get(ctx, uuid.New())
	isKind(t, "get unknown", err, saga.ErrNotFound)
}

func testStepsUnknownAndEmpty(t *testing.T, h Harness) {
	_, err := h.Journal.Steps(ctx, uuid.New())
	isKind(t, "steps of unknown", err, saga.ErrNotFound)
	inst := enqueue(t, h)
	steps, err := h.Journal.Steps(ctx, inst.ID)
	if err != nil || steps == nil || len(steps) != 0 {
		t.Fatalf("steps of a new instance = %v (nil %t), %v; want empty non-nil", steps, steps == nil, err)
	}
}

func testClaimInvalid(t *testing.T, h Harness) {
	enqueue(t, h)
	for _, c := range []struct {
		n int
		d time.Duration
	}{{0, lease}, {-1, lease}, {1, 0}, {1, -time.Second}, {1, time.Nanosecond}} {
		got, err := h.Journal.ClaimPending(ctx, c.n, c.d)
		isKind(t, "claim with bad arguments", err, saga.ErrInvalid)
		if len(got) != 0 {
			t.Fatalf("refused claim returned %d instances", len(got))
		}
	}
}

func testClaimDueOrder(t *testing.T, h Harness) {
	now := h.Clock.Now()
	var ids []uuid.UUID
	// Due times: 3 in the past (reverse order), 1 exactly now, 1 in the
	// future.
	for _, off := range []time.Duration{-time.Second, -2 * time.Second, -3 * time.Second, 0, time.Microsecond} {
		inst := newInstance()
		inst.NextAttemptAt = now.Add(off)
		if err := h.Journal.Enqueue(ctx, inst); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, inst.ID)
	}
	got, err := h.Journal.ClaimPending(ctx, 2, lease)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].ID != ids[2] || got[1].ID != ids[1] {
		t.Fatalf("first batch: want the two most overdue in next_attempt_at order, got %v", idsOf(got))
	}
	got, err = h.Journal.ClaimPending(ctx, 10, lease)
	if err != nil {
		t.Fatal(err)
	}
	// The one due exactly now is due; the one a microsecond ahead is not.
	if len(got) != 2 || got[0].ID != ids[0] || got[1].ID != ids[3] {
		t.Fatalf("second batch: want %v, got %v", []uuid.UUID{ids[0], ids[3]}, idsOf(got))
	}
	for _, inst := range got {
		if !inst.LeaseID.Valid {
			t.Fatal("claimed instance without a lease")
		}
		sameTime(t, "lease_expires_at", inst.LeaseExpiresAt, now.Add(lease))
	}
	got, err = h.Journal.ClaimPending(ctx, 10, lease)
	if err != nil || len(got) != 0 {
		t.Fatalf("third claim: %v, %v; want nothing (all held or not due)", idsOf(got), err)
	}
	h.Clock.Advance(time.Microsecond)
	got, err = h.Journal.ClaimPending(ctx, 10, lease)
	if err != nil || len(got) != 1 || got[0].ID != ids[4] {
		t.Fatalf("after a microsecond the last one is due: %v, %v", idsOf(got), err)
	}
}

func idsOf(insts []saga.Instance) []uuid.UUID {
	out := make([]uuid.UUID, len(insts))
	for i, inst := range insts {
		out[i] = inst.ID
	}
	return out
}

func testClaimFreshLeases(t *testing.T, h Harness) {
	for range 5 {
		enqueue(t, h)
	}
	first, err := h.Journal.ClaimPending(ctx, 10, time.Second)
	if err != nil || len(first) != 5 {
		t.Fatalf("claim: %d, %v", len(first), err)
	}
	seen := map[uuid.UUID]bool{}
	for _, inst := range first {
		if seen[inst.LeaseID.UUID] {
			t.Fatal("two instances of one claim share a lease id")
		}
		seen[inst.LeaseID.UUID] = true
		if got := get(t, h.Journal, inst.ID); got.LeaseID != inst.LeaseID {
			t.Fatalf("projection lease %v, claim returned %v", got.LeaseID, inst.LeaseID)
		}
	}
	h.Clock.Advance(time.Second + time.Microsecond)
	second, err := h.Journal.ClaimPending(ctx, 10, time.Second)
	if err != nil || len(second) != 5 {
		t.Fatalf("reclaim after expiry: %d, %v", len(second), err)
	}
	for _, inst := range second {
		if seen[inst.LeaseID.UUID] {
			t.Fatal("a reclaim reused a lease id")
		}
		seen[inst.LeaseID.UUID] = true
	}
}

func testClaimStatuses(t *testing.T, h Harness) {
	done := started(t, h)
	if ok, err := h.Journal.MarkTerminal(ctx, done.ID, done.LeaseID.UUID, saga.StatusCompleted, ""); !ok || err != nil {
		t.Fatalf("mark terminal: %t %v", ok, err)
	}
	comp := started(t, h)
	appendOK(t, h.Journal, comp, saga.Event{Kind: saga.EventStepCompleted, Step: 0})
	appendOK(t, h.Journal, comp, saga.Event{Kind: saga.EventCompensationStarted, Step: 0, Reason: "test"})
	h.Clock.Advance(lease + time.Microsecond)
	got, err := h.Journal.ClaimPending(ctx, 10, lease)
	if err != nil || len(got) != 1 || got[0].ID != comp.ID || got[0].Status != saga.StatusCompensating {
		t.Fatalf("want only the COMPENSATING instance, got %v, %v", idsOf(got), err)
	}
}

// boundary runs fn with the clock set to the lease's expiry plus off.
func boundary(off time.Duration, fn func(t *testing.T, h Harness, inst saga.Instance, off time.Duration)) func(*testing.T, Harness) {
	return func(t *testing.T, h Harness) {
		inst := started(t, h)
		h.Clock.Set(inst.LeaseExpiresAt.Add(off))
		fn(t, h, inst, off)
	}
}

func testAppendAt(t *testing.T, h Harness, inst saga.Instance, off time.Duration) {
	v, err := h.Journal.Append(ctx, inst.ID, inst.LeaseID.UUID, saga.Event{Kind: saga.EventStepCompleted, Step: 0})
	got := get(t, h.Journal, inst.ID)
	if off <= 0 {
		if err != nil || v != 1 || got.Version != 1 || got.CurrentStep != 1 {
			t.Fatalf("append at expiry%+v: v=%d err=%v projection %+v; the lease is still held", off, v, err, got)
		}
		return
	}
	isKind(t, "append a microsecond after expiry", err, saga.ErrLeaseLost)
	if got.Version != 0 || got.CurrentStep != 0 {
		t.Fatalf("a stale append changed the projection: %+v", got)
	}
}

func testClaimAt(t *testing.T, h Harness, inst saga.Instance, off time.Duration) {
	got, err := h.Journal.ClaimPending(ctx, 10, lease)
	if err != nil {
		t.Fatal(err)
	}
	if off <= 0 {
		if len(got) != 0 {
			t.Fatalf("claimed an instance whose lease is live (expiry%+v)", off)
		}
		if p := get(t, h.Journal, inst.ID); p.LeaseID != inst.LeaseID {
			t.Fatal("the live lease was replaced")
		}
		return
	}
	if len(got) != 1 || got[0].ID != inst.ID || got[0].LeaseID == inst.LeaseID || !got[0].LeaseID.Valid {
		t.Fatalf("a microsecond after expiry the instance must be taken over with a new lease: %+v", got)
	}
	sameTime(t, "new lease expiry", got[0].LeaseExpiresAt, h.Clock.Now().Add(lease))
	// The old holder is now fenced out even though a new clock reading would
	// not matter: its lease id is gone.
	_, err = h.Journal.Append(ctx, inst.ID, inst.LeaseID.UUID, saga.Event{Kind: saga.EventStepCompleted, Step: 0})
	isKind(t, "old holder after takeover", err, saga.ErrLeaseLost)
}

func testHeartbeatAt(t *testing.T, h Harness, inst saga.Instance, off time.Duration) {
	ok, err := h.Journal.Heartbeat(ctx, inst.ID, inst.LeaseID.UUID, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got := get(t, h.Journal, inst.ID)
	if off <= 0 {
		if !ok {
			t.Fatalf("heartbeat at expiry%+v refused; the lease is still held", off)
		}
		sameTime(t, "extended expiry", got.LeaseExpiresAt, h.Clock.Now().Add(3*time.Second))
		return
	}
	if ok {
		t.Fatal("heartbeat a microsecond after expiry succeeded")
	}
	sameTime(t, "expiry after a refused heartbeat", got.LeaseExpiresAt, *inst.LeaseExpiresAt)
}

func testMarkTerminalAt(t *testing.T, h Harness, inst saga.Instance, off time.Duration) {
	ok, err := h.Journal.MarkTerminal(ctx, inst.ID, inst.LeaseID.UUID, saga.StatusCompleted, "done")
	if err != nil {
		t.Fatal(err)
	}
	got := get(t, h.Journal, inst.ID)
	if off <= 0 {
		if !ok || got.Status != saga.StatusCompleted {
			t.Fatalf("mark terminal at expiry%+v: %t, status %s; the lease is still held", off, ok, got.Status)
		}
		return
	}
	if ok || got.Status != saga.StatusRunning || got.Version != 0 {
		t.Fatalf("mark terminal a microsecond after expiry: %t, %+v", ok, got)
	}
}

var badEvent = saga.Event{Kind: "no_such_kind", Step: 99, State: json.RawMessage(`{"broken":`)}

func testPrecedenceUnknown(t *testing.T, h Harness) {
	enqueue(t, h) // the journal is not empty
	unknown, someLease := uuid.New(), uuid.New()
	_, err := h.Journal.Append(ctx, unknown, someLease, badEvent)
	isKind(t, "append: unknown instance, bad payload", err, saga.ErrNotFound)
	_, err = h.Journal.Append(ctx, unknown, someLease, saga.Event{Kind: saga.EventCompleted, Step: -1})
	isKind(t, "append: unknown instance, terminal kind", err, saga.ErrNotFound)
	ok, err := h.Journal.Heartbeat(ctx, unknown, someLease, -time.Second)
	if ok || err != nil {
		t.Fatalf("heartbeat: unknown instance, bad duration = %t, %v; want false, nil", ok, err)
	}
	ok, err = h.Journal.MarkTerminal(ctx, unknown, someLease, saga.StatusRunning, "")
	if ok || err != nil {
		t.Fatalf("mark terminal: unknown instance, non-terminal status = %t, %v; want false, nil", ok, err)
	}
	isKind(t, "retry unknown", h.Journal.RequestRetry(ctx, unknown, "x\x00", ""), saga.ErrNotFound)
	isKind(t, "cancel unknown", h.Journal.RequestCancel(ctx, unknown, "x\x00", ""), saga.ErrNotFound)
	_, err = h.Journal.DeliverReply(ctx, uuid.New(), json.RawMessage(`{bad`), "")
	isKind(t, "reply to nobody with a bad payload", err, saga.ErrNotFound)
}

func testPrecedenceStale(t *testing.T, h Harness) {
	inst := started(t, h)
	h.Clock.Set(inst.LeaseExpiresAt.Add(time.Microsecond))
	_, err := h.Journal.Append(ctx, inst.ID, inst.LeaseID.UUID, badEvent)
	isKind(t, "append: stale lease, bad payload", err, saga.ErrLeaseLost)
	ok, err := h.Journal.Heartbeat(ctx, inst.ID, inst.LeaseID.UUID, -time.Second)
	if ok || err != nil {
		t.Fatalf("heartbeat: stale lease, bad duration = %t, %v; want false, nil", ok, err)
	}
	ok, err = h.Journal.MarkTerminal(ctx, inst.ID, inst.LeaseID.UUID, saga.StatusRunning, "")
	if ok || err != nil {
		t.Fatalf("mark terminal: stale lease, non-terminal = %t, %v; want false, nil", ok, err)
	}
	// With the lease live, the same payloads are what is wrong.
	live := claim(t, h.Journal, inst.ID, lease)
	_, err = h.Journal.Append(ctx, live.ID, live.LeaseID.UUID, badEvent)
	isKind(t, "append: live lease, bad payload", err, saga.ErrInvalid)
	ok, err = h.Journal.Heartbeat(ctx, live.ID, live.LeaseID.UUID, -time.Second)
	if ok {
		t.Fatal("heartbeat with a negative duration succeeded")
	}
	isKind(t, "heartbeat: live lease, bad duration", err, saga.ErrInvalid)
}

func testAppendWrongLease(t *testing.T, h Harness) {
	inst := started(t, h)
	_, err := h.Journal.Append(ctx, inst.ID, uuid.New(), saga.Event{Kind: saga.EventStepCompleted, Step: 0})
	isKind(t, "append with another lease id", err, saga.ErrLeaseLost)
	if got := get(t, h.Journal, inst.ID); got.Version != 0 {
		t.Fatalf("wrong lease changed the instance: %+v", got)
	}
}

func testAppendKinds(t *testing.T, h Harness) {
	inst := started(t, h)
	for _, k := range []saga.EventKind{saga.EventCompleted, saga.EventFailed, saga.EventRetryRequested, saga.EventCancelRequested, saga.EventReplyReceived} {
		_, err := h.Journal.Append(ctx, inst.ID, inst.LeaseID.UUID, saga.Event{Kind: k, Step: 0, CorrelationID: uuid.New(), Output: json.RawMessage(`1`)})
		isKind(t, "append "+string(k), err, saga.ErrInvalid)
	}
	if got := get(t, h.Journal, inst.ID); got.Version != 0 || got.Status != saga.StatusRunning {
		t.Fatalf("refused appends changed the instance: %+v", got)
	}
}

func testAppendIllegal(t *testing.T, h Harness) {
	inst := started(t, h)
	for _, ev := range []saga.Event{
		{Kind: saga.EventStepCompleted, Step: 1},
		{Kind: saga.EventStepCompensated, Step: 0},
		{Kind: saga.EventCompensationStarted, Step: 1},
		{Kind: saga.EventStepAwaiting, Step: 0},
	} {
		_, err := h.Journal.Append(ctx, inst.ID, inst.LeaseID.UUID, ev)
		isKind(t, "append "+string(ev.Kind), err, saga.ErrInvalid)
	}
	evs, err := h.Journal.Load(ctx, inst.ID)
	if err != nil || len(evs) != 0 {
		t.Fatalf("refused appends were journaled: %v, %v", evs, err)
	}
	steps, err := h.Journal.Steps(ctx, inst.ID)
	if err != nil || len(steps) != 0 {
		t.Fatalf("refused appends wrote steps: %v, %v", steps, err)
	}
}

func testAppendRoundTrip(t *testing.T, h Harness) {
	inst := started(t, h)
	now := h.Clock.Advance(time.Second)
	corr := uuid.New()
	evs := []saga.Event{
		{Kind: saga.EventStepFailed, Step: 0, StepName: "reserve", Error: "timeout", RetryIn: 1500 * time.Millisecond, Actor: "worker-1"},
		{Kind: saga.EventStepAwaiting, Step: 0, StepName: "reserve", CorrelationID: corr, AwaitFor: time.Minute,
			State: json.RawMessage(`{"n": 2, "list": [1, 2]}`), Output: json.RawMessage(`{"cmd": "sent"}`)},
	}
	for i, ev := range evs {
		if v := appendOK(t, h.Journal, inst, ev); v != int64(i+1) {
			t.Fatalf("append #%d returned version %d", i, v)
		}
	}
	got, err := h.Journal.Load(ctx, inst.ID)
	if err != nil || len(got) != 2 {
		t.Fatalf("load: %v, %v", got, err)
	}
	for i, rec := range got {
		want := evs[i]
		if rec.InstanceID != inst.ID || rec.Version != int64(i+1) || rec.GlobalSeq <= 0 || !rec.CreatedAt.Equal(now) {
			t.Fatalf("event %d header: %+v", i, rec)
		}
		if i > 0 && rec.GlobalSeq <= got[i-1].GlobalSeq {
			t.Fatalf("global sequence not increasing: %d then %d", got[i-1].GlobalSeq, rec.GlobalSeq)
		}
		if !JSONEqual(rec.State, want.State) || !JSONEqual(rec.Output, want.Output) {
			t.Fatalf("event %d json: %s %s", i, rec.State, rec.Output)
		}
		rec.State, rec.Output, want.State, want.Output = nil, nil, nil, nil
		if !reflect.DeepEqual(rec.Event, want) {
			t.Fatalf("event %d = %+v, want %+v", i, rec.Event, want)
		}
	}
	p := get(t, h.Journal, inst.ID)
	if p.Version != 2 || p.Attempt != 1 || p.LastError != "timeout" || p.AwaitingCorrelationID.UUID != corr ||
		!JSONEqual(p.Context, evs[1].State) || !p.UpdatedAt.Equal(now) {
		t.Fatalf("projection: %+v", p)
	}
	sameTime(t, "awaiting_until", p.AwaitingUntil, now.Add(time.Minute))
	if !p.NextAttemptAt.Equal(now.Add(time.Minute)) {
		t.Fatalf("next_attempt_at %v, want the end of the wait", p.NextAttemptAt)
	}
	steps, err := h.Journal.Steps(ctx, inst.ID)
	if err != nil || len(steps) != 1 {
		t.Fatalf("steps: %v, %v", steps, err)
	}
	s := steps[0]
	if s.Sequence != 0 || s.Name != "reserve" || s.Status != saga.StepRunning || s.Attempts != 1 || s.LastError != "timeout" ||
		!JSONEqual(s.Output, json.RawMessage(`{"cmd":"sent"}`)) || s.CompletedAt != nil {
		t.Fatalf("step record: %+v", s)
	}
	sameTime(t, "step started_at", s.StartedAt, now)
}

func testHeartbeatExtends(t *testing.T, h Harness) {
	inst := started(t, h)
	now := h.Clock.Advance(2 * time.Second)
	ok, err := h.Journal.Heartbeat(ctx, inst.ID, inst.LeaseID.UUID, time.Minute)
	if !ok || err != nil {
		t.Fatalf("heartbeat: %t %v", ok, err)
	}
	got := get(t, h.Journal, inst.ID)
	sameTime(t, "lease after heartbeat", got.LeaseExpiresAt, now.Add(time.Minute))
	if got.LeaseID != inst.LeaseID || got.Version != 0 {
		t.Fatalf("heartbeat changed more than the expiry: %+v", got)
	}
	ok, err = h.Journal.Heartbeat(ctx, inst.ID, uuid.New(), time.Minute)
	if ok || err != nil {
		t.Fatalf("heartbeat with a foreign lease = %t, %v; want false, nil", ok, err)
	}
}

func testMarkTerminal(t *testing.T, h Harness) {
	inst := started(t, h)
	appendOK(t, h.Journal, inst, saga.Event{Kind: saga.EventStepCompleted, Step: 0})
	now := h.Clock.Advance(time.Second)
	ok, err := h.Journal.MarkTerminal(ctx, inst.ID, inst.LeaseID.UUID, saga.StatusCompleted, "all steps done")
	if !ok || err != nil {
		t.Fatalf("mark terminal: %t %v", ok, err)
	}
	got := get(t, h.Journal, inst.ID)
	if got.Status != saga.StatusCompleted || got.LeaseID.Valid || got.LeaseExpiresAt != nil || got.Version != 2 {
		t.Fatalf("terminal projection: %+v", got)
	}
	sameTime(t, "completed_at", got.CompletedAt, now)
	evs, err := h.Journal.Load(ctx, inst.ID)
	if err != nil || len(evs) != 2 || evs[1].Kind != saga.EventCompleted || evs[1].Reason != "all steps done" || evs[1].Version != 2 {
		t.Fatalf("terminal event: %+v, %v", evs, err)
	}
	// The lease is released: the same holder cannot write again.
	ok, err = h.Journal.MarkTerminal(ctx, inst.ID, inst.LeaseID.UUID, saga.StatusCompleted, "again")
	if ok || err != nil {
		t.Fatalf("second mark terminal = %t, %v; want false, nil", ok, err)
	}
	_, err = h.Journal.Append(ctx, inst.ID, inst.LeaseID.UUID, saga.Event{Kind: saga.EventStepCompleted, Step: 1})
	isKind(t, "append after terminal", err, saga.ErrLeaseLost)
}

func testMarkTerminalInvalid(t *testing.T, h Harness) {
	inst := started(t, h)
	for _, s := range []saga.Status{saga.StatusRunning, saga.StatusCompensating, "BOGUS"} {
		ok, err := h.Journal.MarkTerminal(ctx, inst.ID, inst.LeaseID.UUID, s, "")
		if ok {
			t.Fatalf("mark terminal %s succeeded", s)
		}
		isKind(t, "mark terminal "+string(s), err, saga.ErrInvalid)
	}
	// RUNNING cannot end FAILED, COMPENSATED or TIMED_OUT without compensating.
	for _, s := range []saga.Status{saga.StatusFailed, saga.StatusCompensated, saga.StatusTimedOut} {
		ok, err := h.Journal.MarkTerminal(ctx, inst.ID, inst.LeaseID.UUID, s, "")
		if ok {
			t.Fatalf("RUNNING -> %s succeeded", s)
		}
		isKind(t, "RUNNING -> "+string(s), err, saga.ErrInvalid)
	}
	if got := get(t, h.Journal, inst.ID); got.Status != saga.StatusRunning || got.Version != 0 || !got.LeaseID.Valid {
		t.Fatalf("refused terminal changed the instance: %+v", got)
	}
}

// compensatingAt brings a claimed instance through step 0 (completed) and
// into compensation of step 0.
func compensatingAt(t *testing.T, h Harness, inst saga.Instance) {
	t.Helper()
	appendOK(t, h.Journal, inst, saga.Event{Kind: saga.EventStepCompleted, Step: 0, StepName: "a"})
	appendOK(t, h.Journal, inst, saga.Event{Kind: saga.EventStepFailed, Step: 1, StepName: "b", Error: "no"})
	appendOK(t, h.Journal, inst, saga.Event{Kind: saga.EventCompensationStarted, Step: 0, Reason: "step b failed"})
}

func testRetryFailed(t *testing.T, h Harness) {
	inst := started(t, h)
	compensatingAt(t, h, inst)
	appendOK(t, h.Journal, inst, saga.Event{Kind: saga.EventCompensationFailed, Step: 0, Error: "undo failed"})
	if ok, err := h.Journal.MarkTerminal(ctx, inst.ID, inst.LeaseID.UUID, saga.StatusFailed, "gave up"); !ok || err != nil {
		t.Fatalf("mark FAILED: %t %v", ok, err)
	}
	now := h.Clock.Advance(time.Hour)
	if err := h.Journal.RequestRetry(ctx, inst.ID, "fixed the downstream", "ops@example"); err != nil {
		t.Fatal(err)
	}
	got := get(t, h.Journal, inst.ID)
	if got.Status != saga.StatusCompensating || got.CurrentStep != 0 || got.Attempt != 0 || !got.NextAttemptAt.Equal(now) {
		t.Fatalf("after retry: %+v", got)
	}
	steps, _ := h.Journal.Steps(ctx, inst.ID)
	if len(steps) != 2 || steps[0].Status != saga.StepCompleted || steps[0].CompensationAttempts != 0 || steps[0].Attempts != 1 {
		t.Fatalf("retry must reset the compensation counter and mark nothing done: %+v", steps)
	}
	evs, _ := h.Journal.Load(ctx, inst.ID)
	last := evs[len(evs)-1]
	if last.Kind != saga.EventRetryRequested || last.Reason != "fixed the downstream" || last.Actor != "ops@example" {
		t.Fatalf("retry event: %+v", last)
	}
	again := claim(t, h.Journal, inst.ID, lease)
	if again.Status != saga.StatusCompensating {
		t.Fatalf("reclaimed as %s", again.Status)
	}
}

func testRetryRevokes(t *testing.T, h Harness) {
	inst := started(t, h)
	appendOK(t, h.Journal, inst, saga.Event{Kind: saga.EventStepFailed, Step: 0, Error: "x", RetryIn: time.Hour})
	if err := h.Journal.RequestRetry(ctx, inst.ID, "", "ops"); err != nil {
		t.Fatal(err)
	}
	// The zombie holder is fenced out although its lease had not expired.
	_, err := h.Journal.Append(ctx, inst.ID, inst.LeaseID.UUID, saga.Event{Kind: saga.EventStepCompleted, Step: 0})
	isKind(t, "append after retry", err, saga.ErrLeaseLost)
	if ok, err := h.Journal.Heartbeat(ctx, inst.ID, inst.LeaseID.UUID, lease); ok || err != nil {
		t.Fatalf("heartbeat after retry: %t %v", ok, err)
	}
	got := get(t, h.Journal, inst.ID)
	if got.Attempt != 0 || got.LeaseID.Valid || !got.NextAttemptAt.Equal(h.Clock.Now()) {
		t.Fatalf("after retry: %+v", got)
	}
	steps, _ := h.Journal.Steps(ctx, inst.ID)
	if steps[0].Attempts != 0 || steps[0].Status != saga.StepFailed {
		t.Fatalf("retry of a RUNNING step: %+v", steps[0])
	}
	claim(t, h.Journal, inst.ID, lease)
}

func testRetryRefusals(t *testing.T, h Harness) {
	inst := started(t, h)
	if ok, err := h.Journal.MarkTerminal(ctx, inst.ID, inst.LeaseID.UUID, saga.StatusCompleted, ""); !ok || err != nil {
		t.Fatal(ok, err)
	}
	isKind(t, "retry a COMPLETED instance", h.Journal.RequestRetry(ctx, inst.ID, "", ""), saga.ErrInvalid)
	isKind(t, "cancel a COMPLETED instance", h.Journal.RequestCancel(ctx, inst.ID, "", ""), saga.ErrInvalid)
	isKind(t, "retry with a NUL reason", h.Journal.RequestRetry(ctx, inst.ID, "a\x00", ""), saga.ErrInvalid)
	if got := get(t, h.Journal, inst.ID); got.Version != 1 {
		t.Fatalf("refused requests were journaled: version %d", got.Version)
	}
}

func testCancel(t *testing.T, h Harness) {
	inst := started(t, h)
	appendOK(t, h.Journal, inst, saga.Event{Kind: saga.EventStepCompleted, Step: 0})
	appendOK(t, h.Journal, inst, saga.Event{Kind: saga.EventStepAwaiting, Step: 1, CorrelationID: uuid.New(), AwaitFor: time.Hour})
	now := h.Clock.Advance(time.Second)
	if err := h.Journal.RequestCancel(ctx, inst.ID, "customer withdrew", "ops"); err != nil {
		t.Fatal(err)
	}
	got := get(t, h.Journal, inst.ID)
	if got.Status != saga.StatusCompensating || got.CurrentStep != 1 || got.CompensationReason != "customer withdrew" ||
		got.LeaseID.Valid || got.AwaitingCorrelationID.Valid || !got.NextAttemptAt.Equal(now) {
		t.Fatalf("after cancel: %+v", got)
	}
	_, err := h.Journal.Append(ctx, inst.ID, inst.LeaseID.UUID, saga.Event{Kind: saga.EventStepCompleted, Step: 1})
	isKind(t, "zombie append after cancel", err, saga.ErrLeaseLost)
	isKind(t, "cancel twice", h.Journal.RequestCancel(ctx, inst.ID, "", ""), saga.ErrInvalid)
	// The runner compensates from the step that may have acted.
	c := claim(t, h.Journal, inst.ID, lease)
	appendOK(t, h.Journal, c, saga.Event{Kind: saga.EventStepCompensated, Step: 1})
	appendOK(t, h.Journal, c, saga.Event{Kind: saga.EventStepCompensated, Step: 0})
	if ok, err := h.Journal.MarkTerminal(ctx, c.ID, c.LeaseID.UUID, saga.StatusCompensated, "cancelled"); !ok || err != nil {
		t.Fatalf("mark compensated: %t %v", ok, err)
	}
}

// claimable reports whether a claim now leases id (and leaves it leased).
func claimable(t *testing.T, j saga.Journal, id uuid.UUID) (saga.Instance, bool) {
	t.Helper()
	got, err := j.ClaimPending(ctx, 1000, lease)
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	for _, inst := range got {
		if inst.ID == id {
			return inst, true
		}
	}
	return saga.Instance{}, false
}

func testPauseResume(t *testing.T, h Harness) {
	inst := started(t, h)
	appendOK(t, h.Journal, inst, saga.Event{Kind: saga.EventStepFailed, Step: 0, Error: "boom", RetryIn: time.Minute})
	before := get(t, h.Journal, inst.ID)
	h.Clock.Advance(time.Second)
	if err := h.Journal.RequestPause(ctx, inst.ID, "hold on", "ops"); err != nil {
		t.Fatal(err)
	}
	got := get(t, h.Journal, inst.ID)
	if got.Status != saga.StatusPaused || got.PausedFrom != saga.StatusRunning || got.LeaseID.Valid ||
		got.CurrentStep != 0 || got.Attempt != before.Attempt || !got.NextAttemptAt.Equal(before.NextAttemptAt) {
		t.Fatalf("after pause: %+v (before %+v)", got, before)
	}
	// The runner that held it is fenced out.
	_, err := h.Journal.Append(ctx, inst.ID, inst.LeaseID.UUID, saga.Event{Kind: saga.EventStepCompleted, Step: 0})
	isKind(t, "append by the holder after pause", err, saga.ErrLeaseLost)
	isKind(t, "pause twice", h.Journal.RequestPause(ctx, inst.ID, "again", "ops"), saga.ErrInvalid)
	isKind(t, "cancel a paused instance", h.Journal.RequestCancel(ctx, inst.ID, "x", "ops"), saga.ErrInvalid)
	// Long past its retry time, it is never claimed while paused.
	h.Clock.Advance(time.Hour)
	if _, ok := claimable(t, h.Journal, inst.ID); ok {
		t.Fatal("a PAUSED instance was claimed")
	}
	if err := h.Journal.RequestResume(ctx, inst.ID, "go on", "ops"); err != nil {
		t.Fatal(err)
	}
	got = get(t, h.Journal, inst.ID)
	if got.Status != saga.StatusRunning || got.PausedFrom != "" || got.Attempt != before.Attempt || !got.NextAttemptAt.Equal(before.NextAttemptAt) {
		t.Fatalf("after resume: %+v", got)
	}
	isKind(t, "resume a running instance", h.Journal.RequestResume(ctx, inst.ID, "again", "ops"), saga.ErrInvalid)
	c, ok := claimable(t, h.Journal, inst.ID)
	if !ok {
		t.Fatal("the resumed instance, due since before the pause, was not claimed")
	}
	appendOK(t, h.Journal, c, saga.Event{Kind: saga.EventStepCompleted, Step: 0})
	evs, err := h.Journal.Load(ctx, inst.ID)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, e := range evs {
		if e.Kind == saga.EventPaused || e.Kind == saga.EventResumed {
			kinds = append(kinds, fmt.Sprintf("%s by %s: %s", e.Kind, e.Actor, e.Reason))
		}
	}
	if want := "[paused by ops: hold on resumed by ops: go on]"; fmt.Sprint(kinds) != want {
		t.Fatalf("journal = %v, want %s", kinds, want)
	}
	// Finished instances cannot be paused; unknown ones are not found.
	if ok, err := h.Journal.MarkTerminal(ctx, c.ID, c.LeaseID.UUID, saga.StatusCompleted, ""); !ok || err != nil {
		t.Fatalf("mark completed: %t %v", ok, err)
	}
	isKind(t, "pause a completed instance", h.Journal.RequestPause(ctx, inst.ID, "x", "ops"), saga.ErrInvalid)
	isKind(t, "pause unknown", h.Journal.RequestPause(ctx, uuid.New(), "x", "ops"), saga.ErrNotFound)
	isKind(t, "resume unknown", h.Journal.RequestResume(ctx, uuid.New(), "x", "ops"), saga.ErrNotFound)
}

func testPauseKeepsReply(t *testing.T, h Harness) {
	inst := started(t, h)
	corr := uuid.New()
	appendOK(t, h.Journal, inst, saga.Event{Kind: saga.EventStepAwaiting, Step: 0, CorrelationID: corr, AwaitFor: time.Hour})
	if err := h.Journal.RequestPause(ctx, inst.ID, "hold on", "ops"); err != nil {
		t.Fatal(err)
	}
	id, err := h.Journal.DeliverReply(ctx, corr, json.RawMessage(`{"ok": true}`), "correlator")
	if err != nil || id != inst.ID {
		t.Fatalf("a reply to a paused instance: %s, %v", id, err)
	}
	got := get(t, h.Journal, inst.ID)
	if got.Status != saga.StatusPaused || !JSONEqual(got.Reply, json.RawMessage(`{"ok":true}`)) || got.AwaitingCorrelationID.Valid {
		t.Fatalf("after the reply: %+v", got)
	}
	if _, ok := claimable(t, h.Journal, inst.ID); ok {
		t.Fatal("a reply made a PAUSED instance claimable")
	}
	if err := h.Journal.RequestResume(ctx, inst.ID, "go on", "ops"); err != nil {
		t.Fatal(err)
	}
	c, ok := claimable(t, h.Journal, inst.ID)
	if !ok || !JSONEqual(c.Reply, json.RawMessage(`{"ok":true}`)) {
		t.Fatalf("resumed: claimed %t, reply %s", ok, c.Reply)
	}
}

func testPauseCompensating(t *testing.T, h Harness) {
	inst := started(t, h)
	appendOK(t, h.Journal, inst, saga.Event{Kind: saga.EventStepCompleted, Step: 0})
	if err := h.Journal.RequestCancel(ctx, inst.ID, "withdrawn", "ops"); err != nil {
		t.Fatal(err)
	}
	if err := h.Journal.RequestPause(ctx, inst.ID, "hold on", "ops"); err != nil {
		t.Fatal(err)
	}
	if got := get(t, h.Journal, inst.ID); got.Status != saga.StatusPaused || got.PausedFrom != saga.StatusCompensating {
		t.Fatalf("after pause: %+v", got)
	}
	if err := h.Journal.RequestResume(ctx, inst.ID, "go on", "ops"); err != nil {
		t.Fatal(err)
	}
	got := get(t, h.Journal, inst.ID)
	if got.Status != saga.StatusCompensating || got.CompensationReason != "withdrawn" || got.CurrentStep != 1 {
		t.Fatalf("after resume: %+v", got)
	}
	c, ok := claimable(t, h.Journal, inst.ID)
	if !ok {
		t.Fatal("the resumed compensation was not claimed")
	}
	appendOK(t, h.Journal, c, saga.Event{Kind: saga.EventCompensationSkipped, Step: 1})
}

func testRestart(t *testing.T, h Harness) {
	inst := started(t, h)
	isKind(t, "restart a RUNNING instance", h.Journal.RequestRestart(ctx, inst.ID, 0, "x", "ops"), saga.ErrInvalid)
	appendOK(t, h.Journal, inst, saga.Event{Kind: saga.EventStepCompleted, Step: 0, StepName: "reserve"})
	appendOK(t, h.Journal, inst, saga.Event{Kind: saga.EventCompensationStarted, Step: 0, Reason: "step charge failed"})
	appendOK(t, h.Journal, inst, saga.Event{Kind: saga.EventStepCompensated, Step: 0, StepName: "reserve"})
	if ok, err := h.Journal.MarkTerminal(ctx, inst.ID, inst.LeaseID.UUID, saga.StatusCompensated, "step charge failed"); !ok || err != nil {
		t.Fatalf("mark compensated: %t %v", ok, err)
	}
	now := h.Clock.Advance(time.Second)
	if err := h.Journal.RequestRestart(ctx, inst.ID, 0, "fixed", "ops"); err != nil {
		t.Fatal(err)
	}
	got := get(t, h.Journal, inst.ID)
	if got.Status != saga.StatusRunning || got.CurrentStep != 0 || got.CompletedAt != nil || got.CompensationReason != "" ||
		!got.NextAttemptAt.Equal(now) {
		t.Fatalf("after restart: %+v", got)
	}
	// The compensated step runs again in the new attempt.
	c := claim(t, h.Journal, inst.ID, lease)
	appendOK(t, h.Journal, c, saga.Event{Kind: saga.EventStepCompleted, Step: 0, StepName: "reserve"})
	steps, err := h.Journal.Steps(ctx, inst.ID)
	if err != nil || len(steps) != 1 || steps[0].Status != saga.StepCompleted || steps[0].Attempts != 2 {
		t.Fatalf("steps after the new attempt: %+v, %v", steps, err)
	}
	isKind(t, "restart unknown", h.Journal.RequestRestart(ctx, uuid.New(), 0, "x", "ops"), saga.ErrNotFound)
}

func testDeliverReply(t *testing.T, h Harness) {
	inst := started(t, h)
	corr := uuid.New()
	appendOK(t, h.Journal, inst, saga.Event{Kind: saga.EventStepAwaiting, Step: 0, CorrelationID: corr, AwaitFor: time.Hour})
	_, err := h.Journal.DeliverReply(ctx, uuid.New(), json.RawMessage(`{}`), "correlator")
	isKind(t, "reply nobody waits for", err, saga.ErrNotFound)
	now := h.Clock.Advance(time.Second)
	id, err := h.Journal.DeliverReply(ctx, corr, json.RawMessage(`{"approved": true}`), "correlator")
	if err != nil || id != inst.ID {
		t.Fatalf("deliver: %s, %v", id, err)
	}
	got := get(t, h.Journal, inst.ID)
	if !JSONEqual(got.Reply, json.RawMessage(`{"approved":true}`)) || got.AwaitingCorrelationID.Valid || got.LeaseID.Valid ||
		!got.NextAttemptAt.Equal(now) {
		t.Fatalf("after reply: %+v", got)
	}
	_, err = h.Journal.DeliverReply(ctx, corr, json.RawMessage(`{}`), "correlator")
	isKind(t, "second reply to one wait", err, saga.ErrNotFound)
	_, err = h.Journal.Append(ctx, inst.ID, inst.LeaseID.UUID, saga.Event{Kind: saga.EventStepCompleted, Step: 0})
	isKind(t, "waiting holder after reply", err, saga.ErrLeaseLost)
	// The next holder consumes the reply.
	c := claim(t, h.Journal, inst.ID, lease)
	if !JSONEqual(c.Reply, json.RawMessage(`{"approved":true}`)) {
		t.Fatalf("claimed instance does not carry the reply: %s", c.Reply)
	}
	appendOK(t, h.Journal, c, saga.Event{Kind: saga.EventStepCompleted, Step: 0})
	if got := get(t, h.Journal, inst.ID); got.Reply != nil {
		t.Fatalf("reply not consumed: %s", got.Reply)
	}
}

func testLifecycle(t *testing.T, h Harness) {
	inst := started(t, h)
	j := h.Journal
	appendOK(t, j, inst, saga.Event{Kind: saga.EventStepCompleted, Step: 0, StepName: "reserve", Output: json.RawMessage(`{"r":1}`)})
	appendOK(t, j, inst, saga.Event{Kind: saga.EventStepCompleted, Step: 1, StepName: "charge"})
	appendOK(t, j, inst, saga.Event{Kind: saga.EventStepFailed, Step: 2, StepName: "ship", Error: "carrier down", RetryIn: time.Second})
	appendOK(t, j, inst, saga.Event{Kind: saga.EventStepFailed, Step: 2, StepName: "ship", Error: "carrier down"})
	appendOK(t, j, inst, saga.Event{Kind: saga.EventCompensationStarted, Step: 2, Reason: "ship failed for good"})
	appendOK(t, j, inst, saga.Event{Kind: saga.EventCompensationFailed, Step: 2, Error: "undo timeout", RetryIn: time.Second})
	appendOK(t, j, inst, saga.Event{Kind: saga.EventStepCompensated, Step: 2})
	appendOK(t, j, inst, saga.Event{Kind: saga.EventStepCompensated, Step: 1})
	appendOK(t, j, inst, saga.Event{Kind: saga.EventCompensationSkipped, Step: 0})
	if ok, err := j.MarkTerminal(ctx, inst.ID, inst.LeaseID.UUID, saga.StatusCompensated, "ship failed for good"); !ok || err != nil {
		t.Fatalf("mark compensated: %t %v", ok, err)
	}
	got := get(t, j, inst.ID)
	if got.Status != saga.StatusCompensated || got.CurrentStep != -1 || got.Version != 10 || got.CompensationReason != "ship failed for good" {
		t.Fatalf("final projection: %+v", got)
	}
	steps, err := j.Steps(ctx, inst.ID)
	if err != nil {
		t.Fatal(err)
	}
	type short struct {
		seq            int
		name           string
		status         saga.StepStatus
		attempts, comp int
	}
	var have []short
	for _, s := range steps {
		have = append(have, short{s.Sequence, s.Name, s.Status, s.Attempts, s.CompensationAttempts})
	}
	want := []short{
		{0, "reserve", saga.StepCompleted, 1, 0},
		// Compensation attempts count the one that succeeded, as Attempts
		// counts the Do attempt that completed.
		{1, "charge", saga.StepCompensated, 1, 1},
		{2, "ship", saga.StepCompensated, 2, 2},
	}
	if !reflect.DeepEqual(have, want) {
		t.Fatalf("steps = %+v, want %+v", have, want)
	}
	evs, err := j.Load(ctx, inst.ID)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []saga.EventKind
	for i, e := range evs {
		if e.Version != int64(i+1) {
			t.Fatalf("event %d has version %d", i, e.Version)
		}
		kinds = append(kinds, e.Kind)
	}
	wantKinds := []saga.EventKind{saga.EventStepCompleted, saga.EventStepCompleted, saga.EventStepFailed, saga.EventStepFailed,
		saga.EventCompensationStarted, saga.EventCompensationFailed, saga.EventStepCompensated, saga.EventStepCompensated,
		saga.EventCompensationSkipped, saga.EventCompensated}
	if !slices.Equal(kinds, wantKinds) {
		t.Fatalf("history %v, want %v", kinds, wantKinds)
	}
}

func testLoadEdges(t *testing.T, h Harness) {
	_, err := h.Journal.Load(ctx, uuid.New())
	isKind(t, "load unknown", err, saga.ErrNotFound)
	inst := enqueue(t, h)
	evs, err := h.Journal.Load(ctx, inst.ID)
	if err != nil || evs == nil || len(evs) != 0 {
		t.Fatalf("load of an instance with no events = %v (nil %t), %v; want empty non-nil", evs, evs == nil, err)
	}
}

func testLoadSinceArgs(t *testing.T, h Harness) {
	for _, c := range []struct {
		after int64
		limit int
	}{{0, 0}, {0, -1}, {-1, 10}, {-1, 0}} {
		_, err := h.Journal.LoadSince(ctx, c.after, c.limit)
		isKind(t, "load since with bad arguments", err, saga.ErrInvalid)
	}
	evs, err := h.Journal.LoadSince(ctx, 0, 10)
	if err != nil || evs == nil || len(evs) != 0 {
		t.Fatalf("load since on an empty journal = %v (nil %t), %v; want empty non-nil", evs, evs == nil, err)
	}
	_, err = h.Journal.LoadSince(ctx, 5, 10)
	isKind(t, "load since a sequence that names no event", err, saga.ErrNotFound)
}

// settle bounds how long a tailer may wait for a committed event: it
// becomes readable once every transaction older than its own has ended (in
// PostgreSQL, in the whole cluster, other tests' included).
const settle = 30 * time.Second

// tailN reads n events after `after` in pages of size page, as a tailer
// does, waiting for events that are committed but not yet readable.
func tailN(t *testing.T, j saga.Journal, after int64, n, page int) []saga.RecordedEvent {
	t.Helper()
	deadline := time.Now().Add(settle)
	got := []saga.RecordedEvent{}
	cursor := after
	for len(got) < n {
		evs, err := j.LoadSince(ctx, cursor, page)
		if err != nil {
			t.Fatalf("load since %d: %v", cursor, err)
		}
		if evs == nil {
			t.Fatal("load since returned a nil slice")
		}
		if len(evs) > page {
			t.Fatalf("page of %d events over limit %d", len(evs), page)
		}
		if len(evs) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("tailer got %d of %d committed events in %s", len(got), n, settle)
			}
			time.Sleep(5 * time.Millisecond)
			continue
		}
		got = append(got, evs...)
		cursor = evs[len(evs)-1].GlobalSeq
	}
	if len(got) != n {
		t.Fatalf("tailer got %d events, want %d", len(got), n)
	}
	return got
}

// waitHead waits until HeadSeq reports want.
func waitHead(t *testing.T, j saga.Journal, want int64) {
	t.Helper()
	deadline := time.Now().Add(settle)
	for {
		head, err := j.HeadSeq(ctx)
		if err != nil {
			t.Fatalf("head: %v", err)
		}
		if head == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("head %d, want %d", head, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func testLoadSincePages(t *testing.T, h Harness) {
	a, b := started(t, h), started(t, h)
	var want []uuid.UUID
	for i := range 3 {
		appendOK(t, h.Journal, a, saga.Event{Kind: saga.EventStepCompleted, Step: i})
		want = append(want, a.ID)
		appendOK(t, h.Journal, b, saga.Event{Kind: saga.EventStepFailed, Step: 0, Error: "x"})
		want = append(want, b.ID)
	}
	got := tailN(t, h.Journal, 0, 6, 4)
	versions := map[uuid.UUID]int64{}
	for i, ev := range got {
		if ev.InstanceID != want[i] {
			t.Fatalf("event %d from %s, want %s (commit order)", i, ev.InstanceID, want[i])
		}
		if i > 0 && ev.GlobalSeq <= got[i-1].GlobalSeq {
			t.Fatalf("global sequence %d after %d (these commits did not interleave)", ev.GlobalSeq, got[i-1].GlobalSeq)
		}
		if ev.Version != versions[ev.InstanceID]+1 {
			t.Fatalf("instance %s: version %d after %d", ev.InstanceID, ev.Version, versions[ev.InstanceID])
		}
		versions[ev.InstanceID] = ev.Version
	}
	cursor := got[5].GlobalSeq
	rest, err := h.Journal.LoadSince(ctx, cursor, 10)
	if err != nil || rest == nil || len(rest) != 0 {
		t.Fatalf("caught up: %v (nil %t), %v; want empty non-nil", rest, rest == nil, err)
	}
	waitHead(t, h.Journal, cursor)
	// From the middle: exactly what follows.
	mid, err := h.Journal.LoadSince(ctx, got[2].GlobalSeq, 100)
	if err != nil || len(mid) != 3 || mid[0].GlobalSeq != got[3].GlobalSeq {
		t.Fatalf("load since the third event: %d events, %v", len(mid), err)
	}
}

func testHeadSeq(t *testing.T, h Harness) {
	head, err := h.Journal.HeadSeq(ctx)
	if err != nil || head != 0 {
		t.Fatalf("head of an empty journal = %d, %v; want 0", head, err)
	}
	inst := enqueue(t, h)
	if head, _ = h.Journal.HeadSeq(ctx); head != 0 {
		t.Fatalf("an enqueue is not an event: head %d", head)
	}
	c := claim(t, h.Journal, inst.ID, lease)
	appendOK(t, h.Journal, c, saga.Event{Kind: saga.EventStepCompleted, Step: 0})
	evs, _ := h.Journal.Load(ctx, inst.ID)
	waitHead(t, h.Journal, evs[0].GlobalSeq)
	if ok, err := h.Journal.MarkTerminal(ctx, c.ID, c.LeaseID.UUID, saga.StatusCompleted, ""); !ok || err != nil {
		t.Fatal(ok, err)
	}
	evs, _ = h.Journal.Load(ctx, inst.ID)
	if evs[1].GlobalSeq <= evs[0].GlobalSeq {
		t.Fatalf("global sequence %d then %d", evs[0].GlobalSeq, evs[1].GlobalSeq)
	}
	waitHead(t, h.Journal, evs[1].GlobalSeq)
}

// testSkipAndWait: step_skipped marks a step SKIPPED and moves on;
// step_waiting makes the instance due at Until without counting an attempt,
// and the event keeps Until; a journal that reports the next due instance
// (saga.DueReporter) says when.
func testSkipAndWait(t *testing.T, h Harness) {
	inst := started(t, h)
	j := h.Journal
	appendOK(t, j, inst, saga.Event{Kind: saga.EventStepCompleted, Step: 0, StepName: "reserve"})
	appendOK(t, j, inst, saga.Event{Kind: saga.EventStepSkipped, Step: 1, StepName: "gift", Reason: "when is false"})
	got := get(t, j, inst.ID)
	if got.CurrentStep != 2 || got.Attempt != 0 || got.Status != saga.StatusRunning {
		t.Fatalf("after step_skipped: %+v", got)
	}
	until := h.Clock.Now().Add(time.Hour).Truncate(time.Microsecond)
	appendOK(t, j, inst, saga.Event{Kind: saga.EventStepWaiting, Step: 2, StepName: "cool_off", Until: until})
	got = get(t, j, inst.ID)
	sameTime(t, "awaiting_until", got.AwaitingUntil, until)
	sameTime(t, "next_attempt_at", &got.NextAttemptAt, until)
	if got.Attempt != 0 || got.AwaitingCorrelationID.Valid {
		t.Fatalf("a wait counted an attempt or waits for a reply: %+v", got)
	}
	_, err := j.Append(ctx, inst.ID, inst.LeaseID.UUID, saga.Event{Kind: saga.EventStepSkipped, Step: 2, StepName: "cool_off"})
	isKind(t, "step_skipped of a waiting step", err, saga.ErrInvalid)
	_, err = j.Append(ctx, inst.ID, inst.LeaseID.UUID, saga.Event{Kind: saga.EventStepWaiting, Step: 2, StepName: "cool_off"})
	isKind(t, "step_waiting without Until", err, saga.ErrInvalid)
	if dr, ok := j.(saga.DueReporter); ok {
		d, found, err := dr.NextDue(ctx)
		if err != nil || !found || d != time.Hour {
			t.Fatalf("NextDue = %s %t %v, want 1h", d, found, err)
		}
	}
	if ok, err := j.Heartbeat(ctx, inst.ID, inst.LeaseID.UUID, time.Microsecond); !ok || err != nil {
		t.Fatalf("release: %t %v", ok, err)
	}
	h.Clock.Advance(time.Minute)
	if claimed, err := j.ClaimPending(ctx, 10, lease); err != nil || len(claimed) != 0 {
		t.Fatalf("claimed %d (%v) during the wait", len(claimed), err)
	}
	h.Clock.Set(until)
	inst = claim(t, j, inst.ID, lease)
	appendOK(t, j, inst, saga.Event{Kind: saga.EventStepCompleted, Step: 2, StepName: "cool_off"})
	got = get(t, j, inst.ID)
	if got.AwaitingUntil != nil || got.CurrentStep != 3 {
		t.Fatalf("the wait's end did not clear it: %+v", got)
	}
	steps, err := j.Steps(ctx, inst.ID)
	if err != nil {
		t.Fatal(err)
	}
	var statuses []string
	for _, s := range steps {
		statuses = append(statuses, s.Name+"="+string(s.Status))
	}
	if strings.Join(statuses, " ") != "reserve=COMPLETED gift=SKIPPED cool_off=COMPLETED" {
		t.Fatalf("step records: %v", statuses)
	}
	hist, err := j.Load(ctx, inst.ID)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, e := range hist {
		kinds = append(kinds, string(e.Kind))
		if e.Kind == saga.EventStepWaiting && !e.Until.Equal(until) {
			t.Fatalf("step_waiting kept Until %s, want %s", e.Until, until)
		}
		if e.Kind == saga.EventStepSkipped && e.Reason != "when is false" {
			t.Fatalf("step_skipped kept reason %q", e.Reason)
		}
	}
	if strings.Join(kinds, " ") != "step_completed step_skipped step_waiting step_completed" {
		t.Fatalf("history: %v", kinds)
	}
}

// testRateTurns: three instances take turns of one key spaced 50ms: the
// first runs now and keeps its lease; the second and third are given back,
// due at their own turns (50ms, 100ms), with no lease, so that nobody holds
// them meanwhile; claimed at its turn, an instance runs without taking
// another; another key, and a stale lease, take nothing.
func testRateTurns(t *testing.T, h Harness) {
	rt, ok := h.Journal.(saga.RateTaker)
	if !ok {
		t.Skip("the journal keeps no rate turns")
	}
	const every = 50 * time.Millisecond
	start := h.Clock.Now()
	var insts []saga.Instance
	for range 3 {
		insts = append(insts, started(t, h))
	}
	for i, inst := range insts {
		wait, err := rt.TakeRateTurn(ctx, inst.ID, inst.LeaseID.UUID, "order.pay", every)
		if err != nil {
			t.Fatalf("turn %d: %v", i, err)
		}
		if want := time.Duration(i) * every; wait != want {
			t.Fatalf("turn %d: wait %s, want %s", i, wait, want)
		}
	}
	if wait, err := rt.TakeRateTurn(ctx, started(t, h).ID, uuid.New(), "order.pay", every); !errors.Is(err, saga.ErrLeaseLost) || wait != 0 {
		t.Fatalf("a stale lease: (%s, %v), want ErrLeaseLost", wait, err)
	}
	other := started(t, h)
	if wait, err := rt.TakeRateTurn(ctx, other.ID, other.LeaseID.UUID, "order.pay/another-tenant", every); err != nil || wait != 0 {
		t.Fatalf("another key: (%s, %v), want its own turn now", wait, err)
	}
	if got := get(t, h.Journal, insts[0].ID); !saga.HoldsLease(got, insts[0].LeaseID.UUID, h.Clock.Now()) {
		t.Fatal("the instance whose turn came lost its lease")
	}
	for i, inst := range insts[1:] {
		got := get(t, h.Journal, inst.ID)
		if got.LeaseID.Valid {
			t.Errorf("instance %d given back still leased", i+1)
		}
		sameTime(t, "given back: next_attempt_at", &got.NextAttemptAt, start.Add(time.Duration(i+1)*every))
	}
	// Before its turn, nothing is due; at it, the second is, and runs
	// without taking a turn again: the key's next free turn stays 150ms.
	if got, err := h.Journal.ClaimPending(ctx, 10, lease); err != nil || slices.ContainsFunc(got, func(x saga.Instance) bool { return x.ID == insts[1].ID }) {
		t.Fatalf("claimed before its turn: %v", err)
	}
	h.Clock.Set(start.Add(every))
	second := claim(t, h.Journal, insts[1].ID, lease)
	if wait, err := rt.TakeRateTurn(ctx, second.ID, second.LeaseID.UUID, "order.pay", every); err != nil || wait != 0 {
		t.Fatalf("claimed at its turn: (%s, %v), want to run now", wait, err)
	}
	fresh := started(t, h)
	if wait, err := rt.TakeRateTurn(ctx, fresh.ID, fresh.LeaseID.UUID, "order.pay", every); err != nil || wait != 2*every {
		t.Fatalf("a later instance: (%s, %v), want the turn after the third (%s)", wait, err, 2*every)
	}
	// The turn is used up: taking again reserves a new one.
	if wait, err := rt.TakeRateTurn(ctx, second.ID, second.LeaseID.UUID, "order.pay", every); err != nil || wait != 3*every {
		t.Fatalf("a used turn taken again: (%s, %v), want a new turn %s away", wait, err, 3*every)
	}

	// Turns claimed late do not run together: the claims come long after
	// both turns; the first runs, the second takes the turn a spacing after
	// it.
	const late = "order.refund"
	a, b := started(t, h), started(t, h)
	for i, inst := range []saga.Instance{a, b} {
		if wait, err := rt.TakeRateTurn(ctx, inst.ID, inst.LeaseID.UUID, late, every); err != nil || wait != time.Duration(i)*every {
			t.Fatalf("late key, turn %d: (%s, %v)", i, wait, err)
		}
	}
	h.Clock.Set(start.Add(20 * every))
	b = claim(t, h.Journal, b.ID, lease)
	if wait, err := rt.TakeRateTurn(ctx, b.ID, b.LeaseID.UUID, late, every); err != nil || wait != 0 {
		t.Fatalf("the first late claim: (%s, %v), want to run now", wait, err)
	}
	c := started(t, h)
	if wait, err := rt.TakeRateTurn(ctx, c.ID, c.LeaseID.UUID, late, every); err != nil || wait != every {
		t.Fatalf("a turn right after a late run: (%s, %v), want %s after it", wait, err, every)
	}
}
