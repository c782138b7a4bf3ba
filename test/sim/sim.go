package sim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/memjournal"
)

// Config is one simulation. The zero value of every field but Seed takes a
// default (WithDefaults).
type Config struct {
	Seed uint64
	// Ticks is the length of the faulty phase; afterwards no fault is
	// injected and the run goes on until every instance has ended.
	Ticks int
	// MaxFaults caps the faults injected: 0 sets no cap, a negative value
	// injects none.
	MaxFaults int
	// Skip lists faults not to inject, by their ordinal among the faults
	// the scheduler decided on (1 for the first). The draws happen either
	// way, so a skipped fault changes only what follows from it: Shrink
	// removes faults one by one this way.
	Skip []int
	// Relays is how many simulated relays share the journal (2 to 4).
	Relays int
	// Triggers is how many trigger events the stream carries.
	Triggers int
	// Mutant plants one bug; empty plants none.
	Mutant Mutant
	// FaultScale multiplies every fault's probability (0: 1).
	FaultScale float64
}

// WithDefaults fills the zero fields.
func (c Config) WithDefaults() Config {
	if c.Ticks == 0 {
		c.Ticks = 1500
	}
	if c.Relays == 0 {
		c.Relays = 2 + int(c.Seed%3)
	}
	if c.FaultScale == 0 {
		c.FaultScale = 1
	}
	if c.Triggers == 0 {
		c.Triggers = 16
	}
	return c
}

// quietTicks bounds the phase after the faults: an instance that has not
// ended by then is reported.
const quietTicks = 20000

// Result is what one run did.
type Result struct {
	Config Config
	// Digest is the sha256 of the canonical history.
	Digest string
	// Violations are the broken invariants, each a message.
	Violations []string
	// History is the canonical text, one line per action or event.
	History []string
	// Faults is how many faults were injected.
	Faults int
	Stats  Stats
}

// Stats are a run's figures.
type Stats struct {
	Ticks, Instances, Completed, Compensated, Failed int
	// StaleRefused counts fenced writes the journal refused for a lost
	// lease; DuplicateStarts the starts it refused as a trigger's second.
	Events, Effects, StaleRefused, DuplicateStarts int
	// RepliesLate counts the replies DeliverReply found no wait for: late
	// ones and repeated ones alike, since the first reply ends the wait.
	// RepliesDuplicate counts its ErrConflict (two waits on one
	// correlation id), which the simulation never makes; RepliesForeign
	// the replies parked for coming from another tenant.
	RepliesLate, RepliesDuplicate, RepliesForeign int
	// Held counts the failed attempts held for an operator (a missing
	// grant): never counted as attempts, never compensated.
	Held int
	// UnrecordedActs counts timed-out attempts that acted and of whose
	// step the journal holds no record that an attempt may have acted
	// (their step_failed never committed, and the step they left open was
	// not recorded as interrupted): each is a violation.
	UnrecordedActs int
	// UncompensatedActs counts those of them in an instance that ended
	// COMPENSATED without compensating the step.
	UncompensatedActs int
	// Interrupted counts the step_interrupted events: steps a claim found
	// left open by a holder whose lease was lost (it may have been in an
	// attempt, or between two).
	Interrupted int
	// NeedlessCompensations counts the compensations of steps of which
	// nothing ever happened (no effect, no act, no reply): a timed-out
	// attempt that had not called out yet, or a step recorded as
	// interrupted whose attempt had not begun. The price of counting
	// "may have acted" without knowing.
	NeedlessCompensations int
}

// Failed reports whether an invariant broke.
func (r Result) Failed() bool { return len(r.Violations) > 0 }

// DigestLine is the line `make sim` prints.
func (r Result) DigestLine() string {
	return fmt.Sprintf("seed=%d digest=%s", r.Config.Seed, r.Digest)
}

// world is everything one run holds. Only the scheduler's goroutine touches
// it.
type world struct {
	cfg   Config
	rng   *rand.Rand
	now   time.Time
	start time.Time
	tick  int
	// mem is the journal itself; j is what the relays and the correlator
	// see (mem, or mem behind a mutant).
	mem *memjournal.Journal
	j   simJournal

	sagas    []*sagaDef
	triggers []trigger
	relays   []*relay
	corr     *correlator
	part     *participant

	faults     int
	candidates int
	faultPhase bool

	// instances in the order they were started, and their short names.
	instances []uuid.UUID
	names     map[uuid.UUID]string
	// settled holds the instances seen COMPLETED or COMPENSATED.
	settled map[uuid.UUID]bool
	leases  map[uuid.UUID]int
	// started counts the successful starts per (trigger, saga).
	started map[startKey]int
	ledger  []effect
	// acceptedReplies counts the replies the correlator accepted per
	// correlation id.
	acceptedReplies map[uuid.UUID]int
	commands        map[uuid.UUID]command
	// revoked holds, per "saga.step", until when its grant is missing.
	revoked map[string]time.Time
	cmdSeq  int

	stats      Stats
	violations []string
	hist       []string
}

type startKey struct {
	trigger uuid.UUID
	saga    string
}

// effect is one row of the participants' ledger.
type effect struct {
	inst    uuid.UUID
	step    int
	kind    string // do, comp, acted, reply
	attempt int
	corr    uuid.UUID
	relay   int
}

// Run runs one simulation and checks its invariants.
func Run(cfg Config) Result {
	cfg = cfg.WithDefaults()
	w := newWorld(cfg)
	w.run()
	w.checkAll()
	sum := sha256.New()
	for _, l := range w.hist {
		sum.Write([]byte(l))
		sum.Write([]byte{'\n'})
	}
	return Result{
		Config: cfg, Digest: hex.EncodeToString(sum.Sum(nil)), Violations: w.violations,
		History: w.hist, Faults: w.faults, Stats: w.stats,
	}
}

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func newWorld(cfg Config) *world {
	w := &world{
		cfg:             cfg,
		rng:             rand.New(rand.NewPCG(cfg.Seed, 0x636f6d70656e7361)),
		now:             epoch,
		start:           epoch,
		names:           map[uuid.UUID]string{},
		settled:         map[uuid.UUID]bool{},
		leases:          map[uuid.UUID]int{},
		started:         map[startKey]int{},
		acceptedReplies: map[uuid.UUID]int{},
		commands:        map[uuid.UUID]command{},
		revoked:         map[string]time.Time{},
	}
	w.mem = memjournal.New(func() time.Time { return w.now })
	w.j = wrapJournal(w.mem, cfg.Mutant)
	w.sagas = definitions()
	w.triggers = makeTriggers(w.rng, cfg.Triggers)
	for i := range cfg.Relays {
		w.relays = append(w.relays, &relay{id: i})
	}
	w.corr = &correlator{}
	w.part = &participant{}
	return w
}

var ctx = context.Background()

// logf appends a line to the history. Times are offsets from the start of
// the run, so that the text does not depend on the wall clock.
func (w *world) logf(format string, args ...any) {
	w.hist = append(w.hist, fmt.Sprintf("%5d %9s ", w.tick, w.now.Sub(w.start).Round(time.Millisecond))+fmt.Sprintf(format, args...))
}

func (w *world) violate(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	w.violations = append(w.violations, msg)
	w.logf("VIOLATION %s", msg)
}

// name is an instance's short name in the history: i<n> in start order.
func (w *world) name(id uuid.UUID) string {
	if n, ok := w.names[id]; ok {
		return n
	}
	return id.String()
}

// leaseName numbers leases in the order they are seen: memjournal draws
// their ids at random, and the history must not depend on them.
func (w *world) leaseName(id uuid.UUID) string {
	n, ok := w.leases[id]
	if !ok {
		n = len(w.leases) + 1
		w.leases[id] = n
	}
	return fmt.Sprintf("L%d", n)
}

// fault draws a fault decision with probability p. The draw happens
// whatever the phase, the cap and the skips, so that a fault not injected
// leaves the scheduler's other draws where they were as long as possible.
func (w *world) fault(what string, p float64) bool {
	hit := w.rng.Float64() < p*w.cfg.FaultScale
	if !hit || !w.faultPhase {
		return false
	}
	w.candidates++
	switch {
	case w.cfg.MaxFaults < 0, w.cfg.MaxFaults > 0 && w.faults >= w.cfg.MaxFaults, slices.Contains(w.cfg.Skip, w.candidates):
		return false
	}
	w.faults++
	w.logf("fault %d: %s", w.candidates, what)
	return true
}

func (w *world) run() {
	w.faultPhase = true
	quietFrom := -1
	for w.tick = 0; ; w.tick++ {
		if w.faultPhase && w.tick >= w.cfg.Ticks {
			w.faultPhase = false
			quietFrom = w.tick
			w.quiesce()
		}
		if !w.faultPhase {
			if w.idle() {
				break
			}
			if w.tick-quietFrom > quietTicks {
				w.logf("quiescence not reached after %d ticks", quietTicks)
				break
			}
		}
		w.now = w.now.Add(time.Duration(20+w.rng.IntN(280)) * time.Millisecond)
		w.toLeaseBoundary()
		w.step()
	}
	w.stats.Ticks = w.tick
	w.recordJournal()
}

// toLeaseBoundary sometimes moves the clock to exactly the expiry of a
// lease some relay holds, where the lease is still held and no claim may
// take it: the boundary a rounding error in the fence would cross.
func (w *world) toLeaseBoundary() {
	r := w.relays[w.rng.IntN(len(w.relays))]
	if !w.fault(fmt.Sprintf("clock on relay %d's lease expiry", r.id), 0.02) || len(r.works) == 0 {
		return
	}
	inst, err := w.mem.Get(ctx, r.works[0].inst.ID)
	if err != nil || inst.LeaseExpiresAt == nil || !inst.LeaseExpiresAt.After(w.now) {
		return
	}
	w.now = *inst.LeaseExpiresAt
	w.logf("clock set to %s's lease expiry", w.name(inst.ID))
}

// step is one scheduler decision: a fault, then one actor's turn.
func (w *world) step() {
	for _, r := range w.relays {
		if r.down > 0 {
			r.down--
			if r.down == 0 {
				w.logf("relay %d restarted", r.id)
			}
		}
	}
	if r := w.relays[w.rng.IntN(len(w.relays))]; w.fault(fmt.Sprintf("relay %d paused", r.id), 0.004) {
		r.pausedUntil = w.now.Add(time.Duration(2000+w.rng.IntN(6000)) * time.Millisecond)
		r.resumed = true
	}
	if r := w.relays[w.rng.IntN(len(w.relays))]; r.down == 0 && w.fault(fmt.Sprintf("relay %d crashed between commits", r.id), 0.002) {
		w.crash(r)
	}
	if d := w.sagas[w.rng.IntN(len(w.sagas))]; w.fault(fmt.Sprintf("grant revoked from saga %s", d.name), 0.002) {
		step := d.steps[w.rng.IntN(len(d.steps))]
		w.revoked[d.name+"."+step.name] = w.now.Add(time.Duration(3000+w.rng.IntN(5000)) * time.Millisecond)
		w.logf("grant revoked: step %s.%s until %s", d.name, step.name, w.revoked[d.name+"."+step.name].Sub(w.start))
	}
	if w.faultPhase && w.rng.IntN(60) == 0 {
		w.operatorTurn()
	}
	// Relays get most turns: they do most of the work.
	n := len(w.relays)
	switch x := w.rng.IntN(n*4 + 3); {
	case x < n*4:
		w.relayTurn(w.relays[x/4])
	case x == n*4:
		w.correlatorTurn()
	default:
		w.participantTurn()
	}
}

// quiesce ends the faulty phase: every relay up, every paused instance
// resumed, every paused relay awake.
func (w *world) quiesce() {
	w.logf("quiescence: no more faults")
	clear(w.revoked)
	for _, r := range w.relays {
		if r.down > 0 {
			r.down = 0
			w.logf("relay %d restarted", r.id)
		}
		if r.pausedUntil.After(w.now) {
			r.pausedUntil = w.now
		}
	}
	w.operatorSweep()
}

// operatorSweep is the person who, once the faults stop, resumes what is
// paused and retries the compensations that gave up: a FAILED instance
// compensates again from where it stopped.
func (w *world) operatorSweep() {
	for _, id := range w.instances {
		inst, err := w.mem.Get(ctx, id)
		switch {
		case err != nil:
		case inst.Status == saga.StatusPaused:
			err := w.j.RequestResume(ctx, id, "quiescence", "sim")
			w.logf("operator resume %s: %s", w.name(id), errText(err))
		case inst.Status == saga.StatusFailed:
			err := w.j.RequestRetry(ctx, id, "quiescence", "sim")
			w.logf("operator retry %s: %s", w.name(id), errText(err))
		}
	}
}

// idle reports whether the run is over: every trigger handled and every
// instance ended (or nothing claimable left to end it).
func (w *world) idle() bool {
	if w.corr.acked < len(w.triggers) {
		return false
	}
	if w.tick%500 == 0 {
		// Something may have failed for good after quiescence began (a
		// FAILED compensation is retried once more by the person).
		w.operatorSweep()
	}
	for _, id := range w.instances {
		inst, err := w.mem.Get(ctx, id)
		if err != nil || !inst.Status.Terminal() {
			return false
		}
	}
	return true
}

// recordJournal appends every journal event, in commit order, to the
// history: the digest covers what the journal stored, not only what the
// scheduler did.
func (w *world) recordJournal() {
	evs, err := w.mem.LoadSince(ctx, 0, 1<<30)
	if err != nil {
		w.violate("journal: LoadSince failed: %v", err)
		return
	}
	w.stats.Events = len(evs)
	for _, e := range evs {
		if e.Kind == saga.EventStepFailed && e.Class != "" {
			w.stats.Held++
		}
		if e.Kind == saga.EventStepInterrupted {
			w.stats.Interrupted++
		}
		var b strings.Builder
		fmt.Fprintf(&b, "event %d %s v%d %s step=%d", e.GlobalSeq, w.name(e.InstanceID), e.Version, e.Kind, e.Step)
		if e.Reason != "" {
			fmt.Fprintf(&b, " reason=%q", e.Reason)
		}
		if e.Error != "" {
			fmt.Fprintf(&b, " error=%q", e.Error)
		}
		if e.RetryIn != 0 {
			fmt.Fprintf(&b, " retry_in=%s", e.RetryIn)
		}
		if e.Class != "" {
			fmt.Fprintf(&b, " class=%s", e.Class)
		}
		if e.CorrelationID != uuid.Nil {
			fmt.Fprintf(&b, " corr=%s", w.cmdName(e.CorrelationID))
		}
		fmt.Fprintf(&b, " at=%s", e.CreatedAt.Sub(w.start))
		w.hist = append(w.hist, b.String())
	}
}

// errText is an error as the history shows it. A lease refusal names the
// lease id, which memjournal draws at random: the history keeps its kind
// only.
func errText(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, saga.ErrLeaseLost):
		return "refused: lease lost"
	}
	return err.Error()
}

// crash loses a relay's memory: its work in hand (leases left to expire)
// and its prepared transactions. It comes back empty some ticks later.
func (w *world) crash(r *relay) {
	r.works = nil
	r.down = 5 + w.rng.IntN(30)
	r.pausedUntil = time.Time{}
	w.logf("relay %d crashed: %d ticks down", r.id, r.down)
}
