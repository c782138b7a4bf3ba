package briefs

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/saga"
)

// CreatedPayload is the payload of EventCreated.
type CreatedPayload struct {
	BriefID uuid.UUID `json:"brief_id"`
}

// Create is what the example application does to ask for an enrichment: it
// inserts a DRAFT brief and its EventCreated outbox row in the caller's
// transaction, so that the saga starts exactly when the brief commits. It
// returns the brief's id.
func Create(ctx context.Context, tx pgx.Tx, tenant uuid.UUID, title, body string) (uuid.UUID, error) {
	if title == "" {
		return uuid.Nil, saga.Errorf(saga.ErrInvalid, "briefs: title is empty: a brief needs a title to search sources with")
	}
	var id uuid.UUID
	if err := tx.QueryRow(ctx, insertBriefSQL, tenant, title, body).Scan(&id); err != nil {
		return uuid.Nil, fmt.Errorf("briefs: insert brief: %w", err)
	}
	err := outbox.Write(ctx, tx, outbox.Message{
		TenantID:      tenant,
		AggregateType: AggregateType,
		AggregateID:   id.String(),
		EventType:     EventCreated,
		Payload:       CreatedPayload{BriefID: id},
	})
	if err != nil {
		return uuid.Nil, fmt.Errorf("briefs: %w", err)
	}
	return id, nil
}
