package saga

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Step is one forward action of a saga and its compensation. The runner runs
// Do in a transaction of its own: what Do writes through x.Tx, the outbox rows
// it emits through x.Emit and the step's journal entry with the instance's new
// state commit together, fenced by the instance's lease, or not at all.
//
// Most sagas declare their steps through Define and TypedStep, which decode
// and encode the state; Step is what they produce.
type Step struct {
	Name string
	// Kind names what the step does, for tools that compare definitions
	// (Replay): declared sagas set sql, http, command, wait or emit. Empty
	// for Go steps, whose kind Replay reads from ReplyTimeout and
	// Compensate.
	Kind string
	// Do performs the step. It reads x.State and may replace it (the saved
	// state is what the next step sees) and may set x.Output (stored as the
	// step's output). A nil error commits; an error rolls everything back and
	// counts as a failed attempt: wrap it with Permanent to skip the retries.
	// Do must honour ctx: it ends at the step's Timeout, at a lost lease and
	// at a hard stop.
	Do func(ctx context.Context, x *StepTx) error
	// Compensate undoes what Do did, in a transaction of its own. Optional:
	// a step without one is skipped when the saga compensates. It runs only
	// for a step that committed or may have acted (see the package doc), sees
	// the instance's latest state in x.State and the step's recorded output in
	// x.Output, and should tolerate finding nothing to undo. Its context is
	// not cancelled by a shutdown, only by its own timeout and a lost lease.
	Compensate func(ctx context.Context, x *StepTx) error
	// Retry is the step's policy; zero fields take DefaultStepRetry's.
	Retry RetryPolicy
	// CompensationRetry is the compensation's policy; zero fields take
	// DefaultCompensationRetry's.
	CompensationRetry RetryPolicy
	// Timeout, when positive, bounds one attempt of Do (and of OnReply). An
	// attempt that runs out of time counts as failed and, because it may have
	// acted before it was stopped, makes the step one that gets compensated.
	// It also bounds Compensate; without it Compensate gets the runner's
	// CompensationTimeout.
	Timeout time.Duration
	// ReplyTimeout, when positive, makes this a step that emits a command
	// (x.EmitCommand) and waits for the reply: Do's transaction commits the
	// command and the step stays RUNNING until a reply arrives or
	// ReplyTimeout passes. A failure reply or the timeout count as a failed
	// attempt of the step (a retry runs Do again, with a new command id).
	ReplyTimeout time.Duration
	// OnReplyTimeout says what no reply within ReplyTimeout does. The
	// zero value retries (Do runs again, with a new command id);
	// ReplyTimeoutCompensate compensates at once; ReplyTimeoutFail ends
	// the instance FAILED without compensating, for a person (a manual
	// retry then compensates). The step counts as one that may have acted
	// in every case.
	OnReplyTimeout ReplyTimeoutAction
	// Rate, when set, spaces the starts of Do for this step (by saga name
	// and step name, every version, and the tenant when PerTenant) across
	// every runner that shares the journal, to protect a participant: at
	// most Count per Per, one every Per/Count. Each start takes the next
	// free turn; an instance whose turn is later is given back due at it,
	// so no worker waits for a turn and other steps and sagas go on. The
	// journal must implement RateTaker; otherwise the rate is not enforced.
	Rate *Rate
	// OnReply, for a step with ReplyTimeout, runs when a success reply
	// arrives, in the transaction that completes the step: it may read the
	// reply into x.State. Optional; without it the state is kept and the
	// reply's payload becomes the step's output.
	OnReply func(ctx context.Context, x *StepTx, reply Reply) error
}

// Rate is a step's rate limit: at most Count starts per Per, shared by
// every tenant, or per tenant with PerTenant.
type Rate struct {
	Count int
	Per   time.Duration
	// PerTenant gives each tenant its own turns: Count per Per for each,
	// so that one tenant's backlog never delays another's starts (and the
	// participant may see Count per Per times the number of busy tenants).
	PerTenant bool
}

// Every is the spacing between two starts.
func (r Rate) Every() time.Duration { return r.Per / time.Duration(r.Count) }

// Key names the turns a start of step of saga (by tenant) takes: the saga
// and step names, and the tenant when PerTenant.
func (r Rate) Key(saga, step string, tenant uuid.UUID) string {
	if r.PerTenant {
		return saga + "." + step + "/" + tenant.String()
	}
	return saga + "." + step
}

// ReplyTimeoutAction is what a step does when its reply does not come in
// time (Step.OnReplyTimeout).
type ReplyTimeoutAction string

const (
	ReplyTimeoutRetry      ReplyTimeoutAction = ""
	ReplyTimeoutCompensate ReplyTimeoutAction = "compensate"
	ReplyTimeoutFail       ReplyTimeoutAction = "fail"
)

// awaitsReply reports whether the step waits for a reply after Do.
func (s Step) awaitsReply() bool { return s.ReplyTimeout > 0 }

func (s Step) validate() error {
	if s.Do == nil {
		return fmt.Errorf("Do is nil: a step needs something to do")
	}
	if s.Timeout < 0 {
		return fmt.Errorf("Timeout must not be negative, got %s", s.Timeout)
	}
	if s.ReplyTimeout < 0 {
		return fmt.Errorf("ReplyTimeout must not be negative, got %s", s.ReplyTimeout)
	}
	if s.OnReply != nil && s.ReplyTimeout == 0 {
		return fmt.Errorf("OnReply is set but ReplyTimeout is zero: a step waits for a reply only with a ReplyTimeout")
	}
	switch s.OnReplyTimeout {
	case ReplyTimeoutRetry, ReplyTimeoutCompensate, ReplyTimeoutFail:
	default:
		return fmt.Errorf("OnReplyTimeout %q is not one of retry (empty), compensate, fail", s.OnReplyTimeout)
	}
	if s.OnReplyTimeout != ReplyTimeoutRetry && s.ReplyTimeout == 0 {
		return fmt.Errorf("OnReplyTimeout is set but ReplyTimeout is zero: only a step that waits for a reply can time out")
	}
	if s.Rate != nil && (s.Rate.Count < 1 || s.Rate.Per <= 0 || s.Rate.Every() <= 0) {
		return fmt.Errorf("Rate must allow at least one start per positive period, got %d per %s", s.Rate.Count, s.Rate.Per)
	}
	if err := s.Retry.validate("Retry", DefaultStepRetry); err != nil {
		return err
	}
	return s.CompensationRetry.validate("CompensationRetry", DefaultCompensationRetry)
}

// StepTx is what a step's function sees: the transaction it writes in, the
// instance it works for, the state to read and replace, and the outbox it
// emits to. It is valid only during the call.
type StepTx struct {
	// Tx is the step's transaction. Do not commit or roll it back: the
	// runner does, after it has appended the step's journal entry.
	Tx pgx.Tx
	// Instance is the projection as the runner claimed it (id, tenant,
	// trigger event, correlation id, attempt, ...).
	Instance Instance
	// Step is the index of the step (0-based) and StepName its name.
	Step     int
	StepName string
	// Attempt is this attempt's number, 1 for the first (of Do, or of
	// Compensate when compensating).
	Attempt int
	// State is the saga's JSON state. Do may replace it; Compensate's
	// changes are not saved.
	State json.RawMessage
	// Output is stored as the step's output when Do commits. Compensate
	// sees the output the step recorded.
	Output json.RawMessage
	// CommandID is, for a step that waits for a reply, the id that
	// EmitCommand gives the command; the reply carries it as its
	// correlation id. A new one per attempt. Compensate sees the id of the
	// last command the step sent, so that it can cancel it.
	CommandID uuid.UUID

	emitter
}

// Reply is a reply event delivered to a waiting step.
//
// The reply payload convention: a JSON object; it reports a failure when it
// has a non-empty string "error" or "ok": false, and success otherwise.
// "permanent": true on a failure asks that the step not be retried (the saga
// compensates at once). For example {"ok":true,"document_id":"…"} and
// {"error":"quota exceeded","permanent":true}.
type Reply struct {
	// Payload is the reply event's payload as delivered.
	Payload json.RawMessage
	// OK reports success by the convention above.
	OK bool
	// Error is the failure's message ("error", or a fixed text for
	// "ok": false without one).
	Error string
	// Permanent: the failure must not be retried.
	Permanent bool
}

// ParseReply reads a reply payload by the convention documented on Reply. A
// payload that is not a JSON object is a permanent failure: retrying the step
// would only provoke another reply nobody can read.
func ParseReply(payload json.RawMessage) Reply {
	r := Reply{Payload: payload}
	var body struct {
		OK        *bool           `json:"ok"`
		Error     json.RawMessage `json:"error"`
		Permanent bool            `json:"permanent"`
	}
	trimmed := bytes.TrimSpace(payload)
	if len(trimmed) == 0 || trimmed[0] != '{' || json.Unmarshal(trimmed, &body) != nil {
		r.Error = "reply payload is not a JSON object"
		r.Permanent = true
		return r
	}
	var msg string
	if len(body.Error) > 0 && !bytes.Equal(body.Error, []byte("null")) {
		if err := json.Unmarshal(body.Error, &msg); err != nil {
			// An error that is an object or a number is still an error.
			msg = string(body.Error)
		}
	}
	switch {
	case msg != "":
		r.Error = msg
	case body.OK != nil && !*body.OK:
		r.Error = `reply says "ok": false`
	default:
		r.OK = true
		return r
	}
	r.Permanent = body.Permanent
	return r
}
