package saga

import (
	"cmp"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/compensa/compensa/outbox"
)

// WakeChannel is the LISTEN/NOTIFY channel a runner listens on by default:
// whoever starts instances or delivers replies sends pg_notify on it in the
// same transaction (NotifyRunners), and every runner claims at once instead
// of at its next poll.
const WakeChannel = "compensa_runner_wake"

// RunnerConfig configures a Runner. A nil config, and every zero field, take
// the defaults documented on the field.
type RunnerConfig struct {
	// Workers is how many instances this runner advances at once (default
	// 8). Each holds a pool connection while it runs a step, so size the
	// pool at Workers + 2 (claims, heartbeats).
	Workers int
	// ClaimBatch caps the instances one claim query leases (default
	// Workers × GroupCommit: while a backlog exists, one claim serves a
	// group for every worker). Without a backlog a runner claims no more
	// than a group for each idle worker; while a backlog exists (the last
	// claim came back full) it claims up to ClaimBatch ahead of
	// them, so that a claim query (a transaction and a commit of its own,
	// one at a time) serves a batch rather than one instance or one group.
	ClaimBatch int
	// GroupCommit is how many claimed instances a worker advances in one
	// transaction when a claim returns more instances than there are idle
	// workers (they go out in as few groups as that allows): one step of
	// each, so that one commit (one WAL flush) serves several steps
	// (default 8; 1 turns it off). Each step's writes, outbox rows and
	// journal entry still commit together, fenced by its own lease: a step
	// that fails or loses its lease takes nothing of its batch-mates with it
	// (see the package doc).
	// Waits, replies, deadlines and compensations run one per transaction,
	// and so does every instance of a claim that finds an idle worker for
	// each, so that a runner that keeps up keeps the latency of one step per
	// transaction.
	GroupCommit int
	// LeaseDuration is how long a claim holds an instance (default 30s). A
	// worker heartbeats every third of it while it still works on the
	// instance; a worker that cannot is fenced out once it expires.
	LeaseDuration time.Duration
	// PollInterval is the first wait after a claim found nothing (default
	// 500ms); each further empty claim doubles it up to MaxPollInterval
	// (default 5s). A wake-up (Wake, NOTIFY) resets it.
	PollInterval    time.Duration
	MaxPollInterval time.Duration
	// CompensationTimeout bounds one attempt of a compensation whose step
	// has no Timeout (default 1 minute). Compensations are detached from
	// shutdown, so something must bound them.
	CompensationTimeout time.Duration
	// OutboxTable is where StepTx.Emit writes (default outbox.DefaultTable).
	OutboxTable string
	// WakeChannel is the channel to LISTEN on (default WakeChannel).
	WakeChannel string
	// DisableListen: do not LISTEN; rely on Wake and polling.
	DisableListen bool
	// Logger receives the runner's logs (default: discard).
	Logger *slog.Logger
	// Hooks receive the runner's metrics events.
	Hooks Hooks
	// TracerProvider makes a span per step attempt and per compensation,
	// children of the span that started the instance (nil: no spans).
	TracerProvider trace.TracerProvider
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c *RunnerConfig) WithDefaults() *RunnerConfig {
	var out RunnerConfig
	if c != nil {
		out = *c
	}
	out.Workers = cmp.Or(out.Workers, 8)
	out.GroupCommit = cmp.Or(out.GroupCommit, 8)
	out.ClaimBatch = cmp.Or(out.ClaimBatch, out.Workers*out.GroupCommit)
	out.LeaseDuration = cmp.Or(out.LeaseDuration, 30*time.Second)
	out.PollInterval = cmp.Or(out.PollInterval, 500*time.Millisecond)
	out.MaxPollInterval = cmp.Or(out.MaxPollInterval, max(5*time.Second, out.PollInterval))
	out.CompensationTimeout = cmp.Or(out.CompensationTimeout, time.Minute)
	out.OutboxTable = cmp.Or(out.OutboxTable, outbox.DefaultTable)
	out.WakeChannel = cmp.Or(out.WakeChannel, WakeChannel)
	if out.Logger == nil {
		out.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &out
}

// validate rejects a configuration (with defaults filled) that cannot work,
// naming the field.
func (c *RunnerConfig) validate() error {
	switch {
	case c.Workers < 1:
		return Errorf(ErrInvalid, "RunnerConfig.Workers must be at least 1, got %d", c.Workers)
	case c.ClaimBatch < 1:
		return Errorf(ErrInvalid, "RunnerConfig.ClaimBatch must be at least 1, got %d", c.ClaimBatch)
	case c.GroupCommit < 0:
		return Errorf(ErrInvalid, "RunnerConfig.GroupCommit must not be negative, got %d", c.GroupCommit)
	case c.LeaseDuration < 100*time.Millisecond:
		return Errorf(ErrInvalid, "RunnerConfig.LeaseDuration must be at least 100ms (heartbeats run every third of it), got %s", c.LeaseDuration)
	case c.PollInterval < time.Millisecond:
		return Errorf(ErrInvalid, "RunnerConfig.PollInterval must be at least 1ms, got %s", c.PollInterval)
	case c.MaxPollInterval < c.PollInterval:
		return Errorf(ErrInvalid, "RunnerConfig.MaxPollInterval (%s) must not be below PollInterval (%s)", c.MaxPollInterval, c.PollInterval)
	case c.CompensationTimeout <= 0:
		return Errorf(ErrInvalid, "RunnerConfig.CompensationTimeout must be positive, got %s", c.CompensationTimeout)
	}
	if _, err := outbox.ParseTableName(c.OutboxTable); err != nil {
		return Errorf(ErrInvalid, "RunnerConfig.OutboxTable: %v", err)
	}
	if len(c.WakeChannel) > 63 {
		return Errorf(ErrInvalid, "RunnerConfig.WakeChannel %q is longer than PostgreSQL's 63-byte identifier limit", c.WakeChannel)
	}
	return nil
}

// Hooks receive what the runner does, for metrics (Prometheus counters and
// histograms plug in here). Every hook is optional, is called synchronously
// from a worker goroutine, concurrently with others, and must be quick.
type Hooks struct {
	// OnStep is called after every attempt of a step or a compensation,
	// whatever its outcome.
	OnStep func(StepEvent)
	// OnTerminal is called when the runner moves an instance to a terminal
	// status.
	OnTerminal func(TerminalEvent)
	// OnClaim is called after every claim query that returned instances.
	OnClaim func(n int, took time.Duration)
	// OnStuck is called when the runner leaves a claimed instance alone
	// because it cannot run it (its definition version is not registered,
	// its current step is beyond the definition's steps).
	OnStuck func(inst Instance, reason string)
}

// Outcome is how one attempt of a step or compensation ended.
type Outcome string

const (
	// OutcomeCompleted: Do (or Compensate) committed.
	OutcomeCompleted Outcome = "completed"
	// OutcomeAwaiting: Do committed its command; the step waits for a reply.
	OutcomeAwaiting Outcome = "awaiting"
	// OutcomeRetry: the attempt failed and another is scheduled.
	OutcomeRetry Outcome = "retry"
	// OutcomeHeld: the attempt failed with an error that is not the
	// step's answer (ClassOperator, ClassTransient): another is scheduled,
	// no attempt is counted, nothing is compensated.
	OutcomeHeld Outcome = "held"
	// OutcomeFailed: the attempt failed for good (a permanent error, or the
	// last attempt): the saga compensates, or a compensation ends FAILED.
	OutcomeFailed Outcome = "failed"
	// OutcomeSkipped: a compensation had nothing to undo, or a step was
	// skipped (Skip).
	OutcomeSkipped Outcome = "skipped"
	// OutcomeWaiting: the step waits for a time (WaitUntil).
	OutcomeWaiting Outcome = "waiting"
	// OutcomeLeaseLost: the lease was lost; the attempt's writes were rolled
	// back and the instance left to its new holder.
	OutcomeLeaseLost Outcome = "lease_lost"
	// OutcomeAborted: a hard stop cancelled the attempt; rolled back, not
	// counted as an attempt.
	OutcomeAborted Outcome = "aborted"
)

// StepEvent describes one attempt of a step or of its compensation.
type StepEvent struct {
	Saga       Key
	InstanceID uuid.UUID
	Step       int
	StepName   string
	// Compensation is true for an attempt of Compensate.
	Compensation bool
	Attempt      int
	Outcome      Outcome
	// TimedOut: the attempt ran out of its Timeout (or its reply timeout).
	TimedOut bool
	Duration time.Duration
	// Err is the attempt's error (nil when completed).
	Err error
}

// TerminalEvent describes an instance reaching a terminal status.
type TerminalEvent struct {
	Saga       Key
	InstanceID uuid.UUID
	Status     Status
	// Reason is the last error for FAILED, the compensation reason for
	// COMPENSATED and TIMED_OUT.
	Reason string
}

func (c *RunnerConfig) String() string {
	return fmt.Sprintf("workers=%d claim_batch=%d group_commit=%d lease=%s poll=%s..%s", c.Workers, c.ClaimBatch, c.GroupCommit, c.LeaseDuration, c.PollInterval, c.MaxPollInterval)
}
