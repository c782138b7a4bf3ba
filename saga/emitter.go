package saga

import (
	"context"
	"errors"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/outbox"
)

// emitter writes a step's outbox rows in the step's transaction, so that they
// exist exactly when the step commits. It is embedded in StepTx.
type emitter struct {
	tx       pgx.Tx
	table    string
	tenant   uuid.UUID
	cause    uuid.UUID
	corr     uuid.UUID
	command  uuid.UUID
	emitted  int
	commands int
	closed   bool
}

// Emit writes msgs to the outbox in the step's transaction, in one round
// trip. Fields left zero are filled from the instance: TenantID with its
// tenant, CausationID with its trigger event, CorrelationID with its
// correlation id. A message that carries the step's CommandID as its
// correlation id is refused: the correlator would take it for the reply.
func (e *emitter) Emit(ctx context.Context, msgs ...outbox.Message) error {
	if e.closed {
		return Errorf(ErrInvalid, "emit after the step returned: the step's transaction is over")
	}
	for i := range msgs {
		m := &msgs[i]
		if m.TenantID == uuid.Nil {
			m.TenantID = e.tenant
		}
		if m.CausationID == uuid.Nil {
			m.CausationID = e.cause
		}
		if m.CorrelationID == uuid.Nil {
			m.CorrelationID = e.corr
		}
		if e.command != uuid.Nil && m.CorrelationID == e.command {
			return Errorf(ErrInvalid, "message %d (%s) carries the step's CommandID as its correlation id: the correlator would deliver it to the step as its own reply", i, m.EventType)
		}
		if e.command != uuid.Nil && m.ID == e.command && e.commands > 0 {
			return Errorf(ErrInvalid, "message %d (%s) reuses the step's CommandID: a command is emitted once per attempt", i, m.EventType)
		}
	}
	if err := outbox.WriteTable(ctx, e.tx, e.table, msgs...); err != nil {
		return err
	}
	e.emitted += len(msgs)
	return nil
}

// EmitCommand writes the command a waiting step sends, with the step's
// CommandID as its id: the service that handles it replies with an event
// whose correlation id is that id (the request–reply convention in the
// package doc). Only a step with a ReplyTimeout emits a command, once per
// attempt.
func (e *emitter) EmitCommand(ctx context.Context, msg outbox.Message) error {
	if e.command == uuid.Nil {
		return Errorf(ErrInvalid, "EmitCommand in a step without ReplyTimeout: only a step that waits for a reply sends a command")
	}
	if e.commands > 0 {
		return Errorf(ErrInvalid, "EmitCommand called twice: a waiting step sends one command per attempt")
	}
	if msg.ID != uuid.Nil && msg.ID != e.command {
		return Errorf(ErrInvalid, "EmitCommand: the command's ID must be left zero (it becomes the step's CommandID)")
	}
	msg.ID = e.command
	if err := e.Emit(ctx, msg); err != nil {
		return err
	}
	e.commands++
	return nil
}

var errNoCommand = errors.New("the step waits for a reply but emitted no command: call StepTx.EmitCommand in Do")
