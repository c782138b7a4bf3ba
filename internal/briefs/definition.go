package briefs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
)

// The saga's identity and its events.
const (
	SagaName    = "brief_enrichment"
	SagaVersion = 1

	// EventCreated triggers the saga: {"brief_id": "<uuid>"}.
	EventCreated = "research_brief.created"
	// EventEnriched is emitted by publish_brief: {"brief_id", "sources"}.
	EventEnriched = "research_brief.enriched"
	// EventEnrichmentReverted is emitted by publish_brief's compensation:
	// {"brief_id"}.
	EventEnrichmentReverted = "research_brief.enrichment_reverted"
	// AggregateType is the aggregate_type of every outbox row about a brief.
	AggregateType = "research_brief"

	// The steps, in order.
	StepClaim   = "claim_brief"
	StepAttach  = "attach_sources"
	StepScore   = "score_brief"
	StepPublish = "publish_brief"

	// FailScoreMarker in a brief's title makes score_brief fail permanently
	// (the saga compensates).
	FailScoreMarker = "[fail-score]"
	// FailUnattachMarker in a brief's title makes attach_sources'
	// compensation fail (retryably) for as long as the title keeps it.
	FailUnattachMarker = "[fail-unattach]"

	// MaxSources caps the documents attached to one brief.
	MaxSources = 5
	// TopKeywords is how many keywords score_brief keeps.
	TopKeywords = 5
	// WordsPerMinute is the reading speed behind reading_minutes.
	WordsPerMinute = 200
)

// CompensationRetry is every step's compensation policy: at most 5 attempts,
// 200 ms after the first failure, doubling, capped at 2 s, so that a
// compensation that cannot succeed ends FAILED about 3 s after it started
// instead of hours later (the runner's default is built for real services).
var CompensationRetry = saga.RetryPolicy{MaxAttempts: 5, Base: 200 * time.Millisecond, Factor: 2, Max: 2 * time.Second}

// ClaimRetry is claim_brief's policy. A brief that cannot be found is retried
// a few times before the saga gives up: the relay may decode the brief's
// commit a moment before a new snapshot can see it (the fault suite caught
// this around database restarts), so "missing" is only final after a while.
var ClaimRetry = saga.RetryPolicy{MaxAttempts: 6, Base: 100 * time.Millisecond, Factor: 2, Max: 2 * time.Second}

// stepTimeout bounds one attempt of a step or compensation. A step is a few
// indexed statements; one that takes this long is stuck on a lock.
const stepTimeout = 30 * time.Second

// Errors a step returns, for errors.Is.
var (
	// ErrNotDraft: claim_brief found the brief in another status than DRAFT
	// (another saga has it, or it is already enriched). Permanent.
	ErrNotDraft = errors.New("brief is not DRAFT")
	// ErrNotEnriching: a later step found the brief no longer ENRICHING
	// (someone changed it under the saga). Permanent.
	ErrNotEnriching = errors.New("brief is not ENRICHING")
	// ErrBriefMissing: the brief does not exist (deleted). Permanent in the
	// later steps; retried by claim_brief (see ClaimRetry).
	ErrBriefMissing = errors.New("brief does not exist")
	// ErrFailScore: the title carries FailScoreMarker. Permanent.
	ErrFailScore = errors.New("title asks score_brief to fail (" + FailScoreMarker + ")")
	// ErrFailUnattach: the title carries FailUnattachMarker. Retryable.
	ErrFailUnattach = errors.New("title asks attach_sources' compensation to fail (" + FailUnattachMarker + ")")
)

// State is the saga's state: the trigger's payload. The steps keep what they
// produce in the database, not here, so the state never goes stale.
type State struct {
	BriefID uuid.UUID `json:"brief_id"`
}

// UnmarshalJSON decodes a trigger's payload with errors that name the field,
// since they end up as the reason of a parked event.
func (s *State) UnmarshalJSON(b []byte) error {
	var raw struct {
		BriefID *string `json:"brief_id"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	s.BriefID = uuid.Nil
	if raw.BriefID == nil {
		return nil // Check reports the missing id
	}
	id, err := uuid.Parse(*raw.BriefID)
	if err != nil {
		shown := *raw.BriefID
		if len(shown) > 64 {
			shown = shown[:64] + "…"
		}
		return fmt.Errorf(`"brief_id" %q is not a UUID: %v`, shown, err)
	}
	s.BriefID = id
	return nil
}

// Definition returns `brief_enrichment` version 1.
func Definition() saga.Definition {
	return saga.Define(saga.TypedDefinition[State]{
		Name:     SagaName,
		Version:  SagaVersion,
		Triggers: []saga.Trigger{{EventType: EventCreated}},
		// The correlator parks a trigger that fails this (and one whose
		// brief_id is not a UUID, which does not decode): a saga that cannot
		// name its brief could only fail.
		Check: func(s *State) error {
			if s.BriefID == uuid.Nil {
				return errors.New(`payload has no "brief_id" (want {"brief_id": "<uuid>"})`)
			}
			return nil
		},
		Steps: []saga.TypedStep[State]{
			{
				Name:              StepClaim,
				Do:                func(ctx context.Context, s *State, x *saga.StepTx) error { return claimBrief(ctx, x.Tx, s.BriefID) },
				Compensate:        func(ctx context.Context, s State, x *saga.StepTx) error { return unclaimBrief(ctx, x.Tx, s.BriefID) },
				Retry:             ClaimRetry,
				CompensationRetry: CompensationRetry,
				Timeout:           stepTimeout,
			},
			{
				Name: StepAttach,
				Do: func(ctx context.Context, s *State, x *saga.StepTx) error {
					srcs, err := attachSources(ctx, x.Tx, s.BriefID)
					if err != nil {
						return err
					}
					return setOutput(x, map[string]any{"sources": srcs})
				},
				Compensate:        func(ctx context.Context, s State, x *saga.StepTx) error { return detachSources(ctx, x.Tx, s.BriefID) },
				CompensationRetry: CompensationRetry,
				Timeout:           stepTimeout,
			},
			{
				Name: StepScore,
				Do: func(ctx context.Context, s *State, x *saga.StepTx) error {
					e, err := scoreBrief(ctx, x.Tx, s.BriefID)
					if err != nil {
						return err
					}
					return setOutput(x, e)
				},
				Compensate:        func(ctx context.Context, s State, x *saga.StepTx) error { return clearScore(ctx, x.Tx, s.BriefID) },
				CompensationRetry: CompensationRetry,
				Timeout:           stepTimeout,
			},
			{
				Name: StepPublish,
				Do: func(ctx context.Context, s *State, x *saga.StepTx) error {
					msg, err := publishBrief(ctx, x.Tx, s.BriefID)
					if err != nil {
						return err
					}
					return x.Emit(ctx, msg)
				},
				Compensate: func(ctx context.Context, s State, x *saga.StepTx) error {
					msg, ok, err := unpublishBrief(ctx, x.Tx, s.BriefID)
					if err != nil || !ok {
						return err
					}
					return x.Emit(ctx, msg)
				},
				CompensationRetry: CompensationRetry,
				Timeout:           stepTimeout,
			},
		},
	})
}

// Register adds Definition to reg.
func Register(reg *saga.Registry) error { return reg.Register(Definition()) }
