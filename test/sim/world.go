package sim

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
)

// sagaDef is a saga as the simulation runs it: the runner's view of a
// Definition (names, which steps compensate, which wait for a reply, the
// retry policies), without Go functions to call.
type sagaDef struct {
	name  string
	steps []stepDef
}

type stepDef struct {
	name string
	// compensates: the step has a Compensate.
	compensates bool
	// command: the step emits a command and waits for its reply
	// (ReplyTimeout > 0, OnReplyTimeout retry).
	command bool
}

const (
	leaseDuration = 2 * time.Second
	replyTimeout  = 3 * time.Second
	claimBatch    = 2
)

// The policies are fixed and without jitter: Delay then draws nothing that
// matters, and the history depends on the seed alone.
var (
	stepRetry = saga.RetryPolicy{MaxAttempts: 3, Base: 300 * time.Millisecond, Factor: 2, Max: 2 * time.Second, Jitter: -1}.WithDefaults(saga.DefaultStepRetry)
	compRetry = saga.RetryPolicy{MaxAttempts: 6, Base: 300 * time.Millisecond, Factor: 2, Max: 2 * time.Second, Jitter: -1}.WithDefaults(saga.DefaultCompensationRetry)
)

func definitions() []*sagaDef {
	return []*sagaDef{
		{name: "order", steps: []stepDef{
			{name: "reserve", compensates: true},
			{name: "charge", compensates: true},
			{name: "ship", compensates: true, command: true},
			{name: "notify"},
		}},
		{name: "refund", steps: []stepDef{
			{name: "lock", compensates: true},
			{name: "pay", compensates: true},
			{name: "unlock"},
		}},
		{name: "audit", steps: []stepDef{
			{name: "record", compensates: true},
			{name: "archive"},
			{name: "index", compensates: true},
			{name: "seal", compensates: true},
			{name: "close"},
		}},
	}
}

func (w *world) def(name string) *sagaDef {
	for _, d := range w.sagas {
		if d.name == name {
			return d
		}
	}
	return nil
}

// trigger is one event of the stream at its position.
type trigger struct {
	id     uuid.UUID
	tenant uuid.UUID
	sagas  []string
}

var (
	simSpace = uuid.MustParse("4f1c6b1e-5a0d-4c3b-9e0e-2d6f3c1a7b90")
	tenants  = []uuid.UUID{
		uuid.NewSHA1(simSpace, []byte("tenant-a")),
		uuid.NewSHA1(simSpace, []byte("tenant-b")),
	}
)

func makeTriggers(rng *rand.Rand, n int) []trigger {
	routes := [][]string{{"order", "audit"}, {"refund"}, {"order"}, {"audit"}}
	out := make([]trigger, n)
	for i := range out {
		out[i] = trigger{
			id:     uuid.NewSHA1(simSpace, fmt.Appendf(nil, "trigger-%d", i)),
			tenant: tenants[rng.IntN(len(tenants))],
			sagas:  routes[rng.IntN(len(routes))],
		}
	}
	return out
}

// instanceID is the id the correlator gives the instance a trigger starts
// for a saga: a replayed trigger names the same instance.
func instanceID(trig uuid.UUID, sagaName string) uuid.UUID {
	return uuid.NewSHA1(trig, []byte(sagaName))
}

// correlator is the simulated correlator and its stream: a checkpoint (the
// acknowledged position, durable) and a read position (in memory).
type correlator struct {
	acked int
	read  int
	down  int
}

// available is how many triggers the application has committed by now:
// they arrive over the faulty phase.
func (w *world) available() int {
	if !w.faultPhase {
		return len(w.triggers)
	}
	return min(len(w.triggers), 1+w.tick*len(w.triggers)*3/(w.cfg.Ticks*2))
}

// correlatorTurn handles one batch: start its sagas, then acknowledge its
// end, as one transaction followed by the flush report.
func (w *world) correlatorTurn() {
	c := w.corr
	if c.down > 0 {
		c.down--
		if c.down == 0 {
			c.read = c.acked
			w.logf("correlator restarted: reading from %d", c.read)
		}
		return
	}
	if w.fault("stream replays from an older position", 0.01) && c.acked > 0 {
		c.read = w.rng.IntN(c.acked + 1)
		w.logf("stream: replay from %d", c.read)
	}
	from := c.read
	if w.fault("stream delivers an older batch again", 0.03) && c.read > 0 {
		from = w.rng.IntN(c.read)
		w.logf("stream: duplicate of the batch at %d", from)
	}
	end := min(from+1+w.rng.IntN(3), w.available())
	if from >= end {
		return
	}
	if w.cfg.Mutant == MutantAckBeforeCommit {
		w.ack(end)
		if w.fault("correlator crashed between acknowledgement and commit", 0.05) {
			w.crashCorrelator()
			return
		}
		w.startBatch(from, end)
		c.read = max(c.read, end)
		return
	}
	w.startBatch(from, end)
	if w.fault("correlator crashed between commit and acknowledgement", 0.05) {
		w.crashCorrelator()
		return
	}
	w.ack(end)
	c.read = max(c.read, end)
}

func (w *world) ack(end int) {
	if end > w.corr.acked {
		w.corr.acked = end
		w.logf("correlator acknowledged %d", end)
	}
}

func (w *world) crashCorrelator() {
	w.corr.down = 3 + w.rng.IntN(10)
	w.logf("correlator crashed: %d turns down", w.corr.down)
}

// startBatch enqueues one instance per (trigger, saga) of triggers
// [from, end): a duplicate start is ErrConflict, and is expected.
func (w *world) startBatch(from, end int) {
	for pos := from; pos < end; pos++ {
		trig := w.triggers[pos]
		for _, name := range trig.sagas {
			id := instanceID(trig.id, name)
			err := w.j.Enqueue(ctx, saga.Instance{ID: id, TenantID: trig.tenant, SagaName: name, SagaVersion: 1, TriggerEventID: trig.id})
			switch {
			case err == nil:
				w.started[startKey{trig.id, name}]++
				if _, seen := w.names[id]; !seen {
					w.names[id] = fmt.Sprintf("i%d", len(w.instances)+1)
					w.instances = append(w.instances, id)
				}
				w.logf("start %s: trigger %d saga %s", w.name(id), pos, name)
			case errors.Is(err, saga.ErrConflict):
				w.stats.DuplicateStarts++
				w.logf("start of trigger %d saga %s refused: duplicate", pos, name)
			default:
				w.violate("correlator: starting trigger %d saga %s failed: %v", pos, name, err)
			}
		}
	}
}

// command is a command a step emitted, as the participant received it.
type command struct {
	inst   uuid.UUID
	tenant uuid.UUID
	name   string
}

func (w *world) newCommand(inst uuid.UUID, tenant uuid.UUID) uuid.UUID {
	w.cmdSeq++
	id := uuid.NewSHA1(simSpace, fmt.Appendf(nil, "command-%d", w.cmdSeq))
	w.commands[id] = command{inst: inst, tenant: tenant, name: fmt.Sprintf("c%d", w.cmdSeq)}
	return id
}

func (w *world) cmdName(id uuid.UUID) string {
	if c, ok := w.commands[id]; ok {
		return c.name
	}
	return id.String()
}

// participant answers commands: a reply is due some time after the command
// committed.
type participant struct {
	replies []reply
}

type reply struct {
	corr    uuid.UUID
	tenant  uuid.UUID
	payload string
	due     time.Time
}

// commandCommitted queues the reply to a command that committed: mostly a
// success, sometimes an error; sometimes later than the step waits.
func (w *world) commandCommitted(corr uuid.UUID, tenant uuid.UUID) {
	payload := fmt.Sprintf(`{"ok":true,"corr":%q}`, corr)
	switch x := w.rng.IntN(20); {
	case x == 0:
		payload = fmt.Sprintf(`{"error":"refused","permanent":true,"corr":%q}`, corr)
	case x < 3:
		payload = fmt.Sprintf(`{"error":"busy","corr":%q}`, corr)
	}
	due := w.now.Add(time.Duration(100+w.rng.IntN(2000)) * time.Millisecond)
	if w.fault("reply late", 0.1) {
		due = due.Add(replyTimeout + time.Second)
	}
	w.part.replies = append(w.part.replies, reply{corr: corr, tenant: tenant, payload: payload, due: due})
}

// participantTurn delivers the first reply that is due, through the
// correlator's reply path.
func (w *world) participantTurn() {
	p := w.part
	for i, r := range p.replies {
		if r.due.After(w.now) {
			continue
		}
		p.replies = append(p.replies[:i], p.replies[i+1:]...)
		if w.fault("reply delivered twice", 0.15) {
			again := r
			again.due = w.now.Add(time.Duration(w.rng.IntN(5000)) * time.Millisecond)
			p.replies = append(p.replies, again)
		}
		if w.fault("reply from another tenant", 0.05) {
			foreign := r
			foreign.tenant = tenants[0]
			if r.tenant == tenants[0] {
				foreign.tenant = tenants[1]
			}
			w.deliverReply(foreign)
		}
		w.deliverReply(r)
		return
	}
}

// deliverReply is the correlator's reply path: a reply from another tenant
// than the command's is parked, never delivered; the others go to the
// journal, which refuses a late or a second one.
func (w *world) deliverReply(r reply) {
	cmd := w.commands[r.corr]
	if r.tenant != cmd.tenant {
		w.stats.RepliesForeign++
		w.logf("reply %s parked: %s", cmd.name, "reply from another tenant")
		return
	}
	id, err := w.j.DeliverReply(ctx, r.corr, []byte(r.payload), "participant")
	switch {
	case err == nil:
		w.acceptedReplies[r.corr]++
		w.logf("reply %s delivered to %s", cmd.name, w.name(id))
	case errors.Is(err, saga.ErrNotFound):
		w.stats.RepliesLate++
		w.logf("reply %s refused: late or unknown", cmd.name)
	case errors.Is(err, saga.ErrConflict):
		w.stats.RepliesDuplicate++
		w.logf("reply %s refused: duplicate", cmd.name)
	default:
		w.violate("reply %s: DeliverReply failed: %v", cmd.name, err)
	}
}

// operatorTurn is a person acting on a random instance through the
// unfenced requests: each revokes any lease.
func (w *world) operatorTurn() {
	if len(w.instances) == 0 {
		return
	}
	id := w.instances[w.rng.IntN(len(w.instances))]
	var what string
	var err error
	switch w.rng.IntN(4) {
	case 0:
		if !w.fault("operator pause", 0.5) {
			return
		}
		what, err = "pause", w.j.RequestPause(ctx, id, "sim", "operator")
	case 1:
		what, err = "resume", w.j.RequestResume(ctx, id, "sim", "operator")
	case 2:
		if !w.fault("operator cancel", 0.3) {
			return
		}
		what, err = "cancel", w.j.RequestCancel(ctx, id, "sim", "operator")
	default:
		what, err = "retry", w.j.RequestRetry(ctx, id, "sim", "operator")
	}
	if err != nil && !errors.Is(err, saga.ErrInvalid) {
		w.violate("operator %s %s: %v", what, w.name(id), err)
	}
	w.logf("operator %s %s: %s", what, w.name(id), errText(err))
}
