package declare

import (
	"time"

	"github.com/compensa/compensa/saga"
)

// The model of a loaded saga: what a file declares, compiled and checked,
// as the builder in load.go makes it and the runtime in define.go runs it.

// Saga is one loaded, validated saga version: its compiled steps, where it
// came from and the hash of its canonical form.
type Saga struct {
	Name     string
	Version  int
	File     string
	Triggers []saga.Trigger
	Deadline time.Duration
	Steps    []*Step
	// Body is the file as written; Hash is the SHA-256 of its canonical
	// form (the parsed document re-encoded as JSON), so that comments and
	// layout do not count as a change.
	Body []byte
	Hash string
	// Egress is the file's egress.allow: the hosts, addresses and networks
	// an http step whose host comes from an expression may reach (with the
	// relay's --http-egress-allow).
	Egress []string

	// Concurrency, when set, limits the instances sharing a key.
	Concurrency *ConcurrencyLimit

	namePos pos
	// contracts are the triggers' filters and schemas, index for index.
	contracts []*triggerContract
}

// ConcurrencyLimit is a saga's concurrency: at most Limit instances with
// the same Key (evaluated on the trigger) run at a time, per tenant unless
// Global.
type ConcurrencyLimit struct {
	Key   *template
	Limit int
	// Global: scope: global, the key shared by every tenant.
	Global bool
}

// Step is one compiled step.
type Step struct {
	Name              string
	Action            Action
	Output            *template
	Timeout           time.Duration
	Retry             saga.RetryPolicy
	CompensationRetry saga.RetryPolicy
	Compensate        *Action
	// When, when set, is evaluated before the step: false skips it.
	When *template
	// Wait makes the step a timer (it has no action then).
	Wait *WaitAction
	// Rate limits the step's starts across relays.
	Rate *saga.Rate
	// Errors are the step's retry_on and fail_on.
	Errors ErrorRules
	at     pos
}

// WaitAction is a timer step: a fixed Duration from when the step starts,
// or Until, an expression giving a timestamp.
type WaitAction struct {
	Duration time.Duration
	Until    *template
}

// Kind names what a step does: sql, http, command, wait or emit (only
// emits).
func (s *Step) Kind() string {
	if s.Wait != nil {
		return "wait"
	}
	return s.Action.Kind()
}

// Action is what a step or a compensation does: at most one of SQL, HTTP,
// Command, plus the rows it emits.
type Action struct {
	SQL     *SQLAction
	HTTP    *HTTPAction
	Command *CommandAction
	Emit    []*Message
	// readsOwnOutput: a compensation whose expressions read its step's
	// output (steps.<own name>).
	readsOwnOutput bool
}

// Kind is sql, http, command, or emit when the action only emits.
func (a *Action) Kind() string {
	switch {
	case a == nil:
		return ""
	case a.SQL != nil:
		return "sql"
	case a.HTTP != nil:
		return "http"
	case a.Command != nil:
		return "command"
	}
	return "emit"
}

// SQLAction runs a parameterised statement.
type SQLAction struct {
	Query  string
	Params []*template
	Expect string
}

// HTTPAction calls out.
type HTTPAction struct {
	Method  string
	URL     *template
	Headers []header
	Body    *template
	// FollowRedirects is "" (never) or FollowSameOrigin.
	FollowRedirects string
	// LiteralHost is the URL's host[:port] when the file writes it
	// literally; "" when it comes from an expression (then the egress
	// allow list applies).
	LiteralHost string
}

type header struct {
	name  string
	value *template
}

// CommandAction emits a command and waits for its reply.
type CommandAction struct {
	Message
	ReplyTimeout time.Duration
	// OnTimeout is what no reply within ReplyTimeout does: "" or "retry",
	// "compensate", "fail" (saga.ReplyTimeoutAction).
	OnTimeout string
}

// Message is an outbox row a step writes.
type Message struct {
	EventType     string
	AggregateType *template
	AggregateID   *template
	Payload       *template
	Headers       []header
}

func (h *HTTPAction) secretNames() []string {
	out := h.URL.secretNames()
	for _, x := range h.Headers {
		out = append(out, x.value.secretNames()...)
	}
	return out
}
