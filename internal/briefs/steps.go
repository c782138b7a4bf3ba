package briefs

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/saga"
)

// The steps' work, on a transaction, apart from the runner's StepTx so that
// tests can run it inside a transaction of their own.

// Statuses of a research brief.
const (
	StatusDraft     = "DRAFT"
	StatusEnriching = "ENRICHING"
	StatusEnriched  = "ENRICHED"
)

// Source is one document attached to a brief; Rank 1 is the most relevant.
type Source struct {
	DocumentID uuid.UUID `json:"document_id"`
	Rank       int       `json:"rank"`
}

// Enrichment is what score_brief stores in research_briefs.enrichment.
type Enrichment struct {
	SourceCount int `json:"source_count"`
	// TotalWords counts the words of the brief's title and body and of
	// every source's title and body: what a reader of the brief reads.
	TotalWords int `json:"total_words"`
	// ReadingMinutes is TotalWords at WordsPerMinute, rounded up.
	ReadingMinutes int `json:"reading_minutes"`
	// TopKeywords are the most frequent words of those texts that are not
	// English stop words, most frequent first.
	TopKeywords []string `json:"top_keywords"`
}

// lockBrief locks the brief's row for the step's transaction and returns its
// title and status; a missing brief is ErrBriefMissing.
func lockBrief(ctx context.Context, tx pgx.Tx, id uuid.UUID) (title, status string, err error) {
	err = tx.QueryRow(ctx, lockBriefSQL, id).Scan(&title, &status)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", fmt.Errorf("brief %s: %w", id, ErrBriefMissing)
	}
	if err != nil {
		return "", "", fmt.Errorf("brief %s: read: %w", id, err)
	}
	return title, status, nil
}

// lockEnriching is lockBrief for the steps after the claim: the brief must
// still be ENRICHING, i.e. still this saga's. Anything else is permanent.
func lockEnriching(ctx context.Context, tx pgx.Tx, step string, id uuid.UUID) (string, error) {
	title, status, err := lockBrief(ctx, tx, id)
	if errors.Is(err, ErrBriefMissing) {
		return "", saga.Permanent(fmt.Errorf("%s: %w", step, err))
	}
	if err != nil {
		return "", fmt.Errorf("%s: %w", step, err)
	}
	if status != StatusEnriching {
		return "", saga.Permanent(fmt.Errorf("%s: brief %s is %s, want %s (was it changed while the saga ran?): %w",
			step, id, status, StatusEnriching, ErrNotEnriching))
	}
	return title, nil
}

// claimBrief is claim_brief: DRAFT → ENRICHING.
func claimBrief(ctx context.Context, tx pgx.Tx, id uuid.UUID) error {
	_, status, err := lockBrief(ctx, tx, id)
	if errors.Is(err, ErrBriefMissing) {
		// Retryable: the trigger may be handled a moment before the brief's
		// row is visible to this snapshot. ClaimRetry bounds the wait.
		return fmt.Errorf("%s: %w", StepClaim, err)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", StepClaim, err)
	}
	if status != StatusDraft {
		return saga.Permanent(fmt.Errorf("%s: brief %s is %s, want %s: %w", StepClaim, id, status, StatusDraft, ErrNotDraft))
	}
	if _, err := tx.Exec(ctx, setStatusSQL, id, StatusEnriching); err != nil {
		return fmt.Errorf("%s: brief %s: %w", StepClaim, id, err)
	}
	return nil
}

// unclaimBrief compensates claim_brief: back to DRAFT. A brief already DRAFT
// or deleted has nothing to undo.
func unclaimBrief(ctx context.Context, tx pgx.Tx, id uuid.UUID) error {
	rows, err := tx.Query(ctx, revertStatusSQL, id)
	if err != nil {
		return fmt.Errorf("compensate %s: brief %s: %w", StepClaim, id, err)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("compensate %s: brief %s: %w", StepClaim, id, err)
	}
	return nil
}

// attachSources is attach_sources: it replaces the brief's sources with the
// MaxSources most relevant documents. Replacing rather than adding keeps a
// second run from stacking sources.
func attachSources(ctx context.Context, tx pgx.Tx, id uuid.UUID) ([]Source, error) {
	if _, err := lockEnriching(ctx, tx, StepAttach, id); err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, deleteSourcesSQL, id); err != nil {
		return nil, fmt.Errorf("%s: brief %s: clear: %w", StepAttach, id, err)
	}
	rows, err := tx.Query(ctx, attachSourcesSQL, id, MaxSources)
	if err != nil {
		return nil, fmt.Errorf("%s: brief %s: search: %w", StepAttach, id, err)
	}
	srcs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Source, error) {
		var s Source
		var rank int64
		err := r.Scan(&s.DocumentID, &rank)
		s.Rank = int(rank)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("%s: brief %s: search: %w", StepAttach, id, err)
	}
	// RETURNING gives no order; the output reads best first.
	slices.SortFunc(srcs, func(a, b Source) int { return cmp.Compare(a.Rank, b.Rank) })
	return srcs, nil
}

// detachSources compensates attach_sources. The title is read now, not when
// the saga started, so that removing FailUnattachMarker and retrying the
// instance lets the compensation through.
func detachSources(ctx context.Context, tx pgx.Tx, id uuid.UUID) error {
	title, _, err := lockBrief(ctx, tx, id)
	if errors.Is(err, ErrBriefMissing) {
		return nil // its sources went with it (ON DELETE CASCADE)
	}
	if err != nil {
		return fmt.Errorf("compensate %s: %w", StepAttach, err)
	}
	if strings.Contains(title, FailUnattachMarker) {
		return fmt.Errorf("compensate %s: brief %s: %w; remove it from the title, then retry the instance", StepAttach, id, ErrFailUnattach)
	}
	if _, err := tx.Exec(ctx, deleteSourcesSQL, id); err != nil {
		return fmt.Errorf("compensate %s: brief %s: %w", StepAttach, id, err)
	}
	return nil
}

// scoreBrief is score_brief: it measures the brief and its sources and
// stores the enrichment.
func scoreBrief(ctx context.Context, tx pgx.Tx, id uuid.UUID) (Enrichment, error) {
	title, err := lockEnriching(ctx, tx, StepScore, id)
	if err != nil {
		return Enrichment{}, err
	}
	if strings.Contains(title, FailScoreMarker) {
		return Enrichment{}, saga.Permanent(fmt.Errorf("%s: brief %s: %w", StepScore, id, ErrFailScore))
	}
	var e Enrichment
	var sources, words int64
	if err := tx.QueryRow(ctx, scoreSQL, id, TopKeywords).Scan(&sources, &words, &e.TopKeywords); err != nil {
		return Enrichment{}, fmt.Errorf("%s: brief %s: measure: %w", StepScore, id, err)
	}
	e.SourceCount, e.TotalWords = int(sources), int(words)
	e.ReadingMinutes = (e.TotalWords + WordsPerMinute - 1) / WordsPerMinute
	b, err := json.Marshal(e)
	if err != nil {
		return Enrichment{}, saga.Permanent(fmt.Errorf("%s: encode enrichment: %w", StepScore, err))
	}
	if _, err := tx.Exec(ctx, setEnrichmentSQL, id, b); err != nil {
		return Enrichment{}, fmt.Errorf("%s: brief %s: store enrichment: %w", StepScore, id, err)
	}
	return e, nil
}

// clearScore compensates score_brief.
func clearScore(ctx context.Context, tx pgx.Tx, id uuid.UUID) error {
	if _, err := tx.Exec(ctx, clearEnrichmentSQL, id); err != nil {
		return fmt.Errorf("compensate %s: brief %s: %w", StepScore, id, err)
	}
	return nil
}

// EnrichedPayload is the payload of EventEnriched.
type EnrichedPayload struct {
	BriefID uuid.UUID `json:"brief_id"`
	// Sources are the attached documents' ids, most relevant first.
	Sources []uuid.UUID `json:"sources"`
}

// publishBrief is publish_brief's database work: ENRICHING → ENRICHED. It
// returns the EventEnriched message for the step to emit in the same
// transaction.
func publishBrief(ctx context.Context, tx pgx.Tx, id uuid.UUID) (outbox.Message, error) {
	if _, err := lockEnriching(ctx, tx, StepPublish, id); err != nil {
		return outbox.Message{}, err
	}
	if _, err := tx.Exec(ctx, setStatusSQL, id, StatusEnriched); err != nil {
		return outbox.Message{}, fmt.Errorf("%s: brief %s: %w", StepPublish, id, err)
	}
	rows, err := tx.Query(ctx, listSourcesSQL, id)
	if err != nil {
		return outbox.Message{}, fmt.Errorf("%s: brief %s: list sources: %w", StepPublish, id, err)
	}
	srcs, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return outbox.Message{}, fmt.Errorf("%s: brief %s: list sources: %w", StepPublish, id, err)
	}
	if srcs == nil {
		srcs = []uuid.UUID{}
	}
	return outbox.Message{
		AggregateType: AggregateType,
		AggregateID:   id.String(),
		EventType:     EventEnriched,
		Payload:       EnrichedPayload{BriefID: id, Sources: srcs},
	}, nil
}

// unpublishBrief is publish_brief's compensation: an ENRICHED brief goes back
// to DRAFT and the EventEnrichmentReverted message is returned for emitting.
// ok is false when the brief was not ENRICHED: nothing to revert, nothing to
// announce.
func unpublishBrief(ctx context.Context, tx pgx.Tx, id uuid.UUID) (msg outbox.Message, ok bool, err error) {
	rows, err := tx.Query(ctx, unpublishSQL, id)
	if err != nil {
		return outbox.Message{}, false, fmt.Errorf("compensate %s: brief %s: %w", StepPublish, id, err)
	}
	n := 0
	for rows.Next() {
		n++
	}
	if err := rows.Err(); err != nil {
		return outbox.Message{}, false, fmt.Errorf("compensate %s: brief %s: %w", StepPublish, id, err)
	}
	if n == 0 {
		return outbox.Message{}, false, nil
	}
	return outbox.Message{
		AggregateType: AggregateType,
		AggregateID:   id.String(),
		EventType:     EventEnrichmentReverted,
		Payload:       map[string]uuid.UUID{"brief_id": id},
	}, true, nil
}

// setOutput records v as the step's output.
func setOutput(x *saga.StepTx, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return saga.Permanent(fmt.Errorf("%s: encode output: %w", x.StepName, err))
	}
	x.Output = b
	return nil
}
