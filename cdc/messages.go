package cdc

import (
	"context"
	"encoding/binary"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"

	"github.com/compensa/compensa/outbox"
)

// Outbox events carried by logical decoding messages
// (pg_logical_emit_message(true, prefix, content), see outbox.Emit): a
// transactional message with Config.MessagePrefix is decoded at its
// transaction's commit, in WAL order with the transaction's outbox rows, and
// becomes an Event like a row with the same fields, Event.Message set. What
// cannot be one is refused: the Event is Poison (a dead letter, never handed
// to a sink's broker), and the stream goes on:
//
//   - a non-transactional message, which PostgreSQL writes whether or not
//     its transaction commits: it reaches the stream on its own, outside
//     any transaction, and is handed over as a batch of its own whose
//     CommitLSN and EndLSN are the message's LSN (the end of its WAL
//     record: acknowledging it never skips the record that follows);
//   - content that is not a JSON object, or has no event_type (see
//     outbox.EventFromMessage).

// MessageIDNamespace is the namespace of the name-based UUIDs (SHA-1) given
// to messages whose content has no id.
var MessageIDNamespace = uuid.MustParse("2b7c41d6-5f3e-4a90-b1c8-6e0d9a7f3c25")

// MessageEventID is the id of a message whose content has none: a
// name-based UUID of its transaction's commit LSN and its own LSN, which
// every replay of the message decodes alike. A non-transactional message
// has no commit: both are its own LSN.
func MessageEventID(commitLSN, lsn pglogrepl.LSN) uuid.UUID {
	var name [16]byte
	binary.BigEndian.PutUint64(name[:8], uint64(commitLSN))
	binary.BigEndian.PutUint64(name[8:], uint64(lsn))
	return uuid.NewSHA1(MessageIDNamespace, name[:])
}

// messageEvent decodes a message of ours into an Event of the transaction
// committed at commitLSN.
func messageEvent(m *pglogrepl.LogicalDecodingMessage, commitLSN pglogrepl.LSN) outbox.Event {
	ev := outbox.EventFromMessage(m.Content)
	ev.Message, ev.LSN = true, uint64(commitLSN)
	if ev.ID == uuid.Nil {
		ev.ID = MessageEventID(commitLSN, m.LSN)
		ev.RawID = ev.ID.String()
	}
	if ev.Poison != "" {
		ev.Raw = messageRaw(m)
	}
	return ev
}

// messageRaw is what a refused message's dead letter keeps: the message as
// PostgreSQL wrote it. correlator's re-drive recognises it by "source".
func messageRaw(m *pglogrepl.LogicalDecodingMessage) map[string]any {
	return map[string]any{
		"source":        "message",
		"prefix":        m.Prefix,
		"transactional": m.Transactional,
		"message_lsn":   m.LSN.String(),
		"content":       string(m.Content),
	}
}

// outboxMessage handles a logical decoding message with our prefix.
func (r *receiver) outboxMessage(ctx context.Context, m *pglogrepl.LogicalDecodingMessage) error {
	if m.Transactional && r.inTx {
		ev := messageEvent(m, r.tx.commitLSN)
		ev.Xid, ev.CreatedAt = r.tx.xid, r.tx.commitTime
		return r.add(ctx, &ev)
	}
	// Refused. pgoutput (protocol version 1) sends a non-transactional
	// message when it decodes it, never inside a transaction it replays.
	ev := messageEvent(m, m.LSN)
	reason := "a non-transactional message (pg_logical_emit_message(false, ...)) is written even when its transaction rolls back, so it is never an outbox event: emit it with transactional = true"
	if m.Transactional {
		reason = "a transactional message arrived outside a transaction"
	}
	if ev.Poison != "" {
		reason += "; " + ev.Poison
	}
	ev.Poison, ev.Raw = reason, messageRaw(m)
	if r.inTx {
		ev.LSN, ev.Xid = uint64(r.tx.commitLSN), r.tx.xid
		return r.add(ctx, &ev)
	}
	// Every transaction handed over before ends at or before the
	// message's record begins, every later one after the record ends: the
	// batch's positions stay in order.
	r.queuedEnd = m.LSN
	return r.hold(ctx, Batch{Slot: r.s.cfg.Slot, Events: []outbox.Event{ev}, CommitLSN: m.LSN, EndLSN: m.LSN, Transactions: 1})
}
