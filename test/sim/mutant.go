package sim

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/memjournal"
)

// Mutant is a bug planted on purpose, to show that the invariants catch
// its class. Each lives in the simulated side (relay, correlator, or a
// wrapper around the journal): the real code is never changed.
type Mutant string

const (
	// MutantAckBeforeCommit: the correlator acknowledges a batch's end
	// position before its starts commit; a crash in between loses them.
	MutantAckBeforeCommit Mutant = "ack-before-commit"
	// MutantNoLeaseFencing: a wrapper journal answers a refused fenced write
	// as if it had been written, so a zombie's transaction commits its
	// effect.
	MutantNoLeaseFencing Mutant = "no-lease-fencing"
	// MutantForwardCompensation: the relay runs the compensations from the
	// first step up instead of from the newest down.
	MutantForwardCompensation Mutant = "forward-compensation"
	// MutantLostJournalWrite: a step's effect commits in a transaction of
	// its own before its journal entry; a crash in between loses the entry
	// and the step runs again.
	MutantLostJournalWrite Mutant = "lost-journal-write"
	// MutantReplyTwice: the reply inbox does not deduplicate: a reply the
	// journal refuses as late or duplicate is accepted again.
	MutantReplyTwice Mutant = "reply-twice"
	// MutantCompensateNeverRan: the relay takes every step as one that
	// acted, and compensates a step whose attempts all rolled back.
	MutantCompensateNeverRan Mutant = "compensate-never-ran"
	// MutantNoErrorClasses: the relay does not classify errors, so a
	// missing grant counts as the step's failure and, once the attempts
	// are spent, compensates the saga.
	MutantNoErrorClasses Mutant = "no-error-classes"
	// MutantForgetInterrupted: the relay ignores the step its claim found
	// left open and records nothing (no step_interrupted): an attempt that
	// acted and lost its lease before its step_failed committed is
	// compensated as one that never acted, as before open steps existed.
	MutantForgetInterrupted Mutant = "forget-interrupted"
)

// Mutants lists every planted bug.
var Mutants = []Mutant{
	MutantAckBeforeCommit, MutantNoLeaseFencing, MutantForwardCompensation,
	MutantLostJournalWrite, MutantReplyTwice, MutantCompensateNeverRan,
	MutantNoErrorClasses, MutantForgetInterrupted,
}

// simJournal is what the relays need of a journal: the Journal, the one
// fenced mutation that ends an instance, and the release of a lease (which
// the runner uses when the journal has it, as memjournal does).
type simJournal interface {
	saga.Journal
	saga.TerminalAppender
	Release(ctx context.Context, instanceID, leaseID uuid.UUID) (bool, error)
}

func wrapJournal(j *memjournal.Journal, m Mutant) simJournal {
	switch m {
	case MutantNoLeaseFencing:
		return &unfencedJournal{Journal: j}
	case MutantReplyTwice:
		return &undedupedJournal{Journal: j, seen: map[uuid.UUID]uuid.UUID{}}
	}
	return j
}

// unfencedJournal turns a lease refusal into a success: the write the
// journal refused is not stored, but the caller's transaction commits.
type unfencedJournal struct{ *memjournal.Journal }

func (u *unfencedJournal) Append(ctx context.Context, id, lease uuid.UUID, ev saga.Event) (int64, error) {
	v, err := u.Journal.Append(ctx, id, lease, ev)
	if errors.Is(err, saga.ErrLeaseLost) {
		return v, nil
	}
	return v, err
}

func (u *unfencedJournal) AppendTerminal(ctx context.Context, id, lease uuid.UUID, ev saga.Event, final saga.Status, reason string) (int64, error) {
	v, err := u.Journal.AppendTerminal(ctx, id, lease, ev, final, reason)
	if errors.Is(err, saga.ErrLeaseLost) {
		return v, nil
	}
	return v, err
}

func (u *unfencedJournal) MarkTerminal(ctx context.Context, id, lease uuid.UUID, final saga.Status, reason string) (bool, error) {
	ok, err := u.Journal.MarkTerminal(ctx, id, lease, final, reason)
	return ok || err == nil, err
}

// undedupedJournal accepts a reply the journal refused when it has seen its
// correlation id before, as an inbox without its dedupe would.
type undedupedJournal struct {
	*memjournal.Journal
	seen map[uuid.UUID]uuid.UUID
}

func (u *undedupedJournal) DeliverReply(ctx context.Context, corr uuid.UUID, reply json.RawMessage, actor string) (uuid.UUID, error) {
	id, err := u.Journal.DeliverReply(ctx, corr, reply, actor)
	if err == nil {
		u.seen[corr] = id
		return id, nil
	}
	if prev, ok := u.seen[corr]; ok {
		return prev, nil
	}
	return id, err
}
