package cdc_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

// emitSQL emits a transactional message in tx and returns its LSN.
func emitSQL(t *testing.T, tx pgx.Tx, transactional bool, prefix, content string) pglogrepl.LSN {
	t.Helper()
	var s string
	if err := tx.QueryRow(context.Background(), `SELECT pg_logical_emit_message($1, $2, $3)::text`, transactional, prefix, content).Scan(&s); err != nil {
		t.Fatal(err)
	}
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return lsn
}

// Logical decoding messages with the prefix are events of their
// transaction, in WAL order with its outbox rows; one without an id gets
// the id of its position, the same when the transaction is read again. A
// rolled-back transaction's message is never seen; a non-transactional
// one, content that is not JSON and content without event_type are poison
// events marked Message (refused), and the stream goes on. Other prefixes
// are ignored. This runs on every server version the harness is given
// (make test-pg17, test-pg18).
func TestMessagesAreEventsOfTheirTransaction(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	var version string
	if err := db.Pool.QueryRow(ctx, `SHOW server_version`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	t.Logf("PostgreSQL %s", version)
	sink := newSink(t, db.Pool)
	sink.keep = true
	// The first handing over of the mixed transaction fails: the stream
	// reads it again, and its messages must come back with the same ids.
	var mu sync.Mutex
	var firstIDs []uuid.UUID
	failed := false
	sink.setBefore(func(_ context.Context, b cdc.Batch) error {
		mu.Lock()
		defer mu.Unlock()
		if failed || len(b.Events) < 4 {
			return nil
		}
		failed = true
		for _, e := range b.Events {
			firstIDs = append(firstIDs, e.ID)
		}
		return errors.New("the first handing over fails")
	})
	startStream(t, baseConfig(t, db), sink)
	testkit.WaitFor(t, 30*time.Second, "first checkpoint", func() bool { return checkpointLSN(t, db.Pool, db.Slot) != 0 })

	// Rolled back: nothing.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.Emit(ctx, tx, outbox.Message{EventType: "rolled.back"}); err != nil {
		t.Fatal(err)
	}
	tx.Rollback(ctx)

	// One transaction: a row, a message with an id, a message without,
	// a message of another prefix, another row.
	row1, withID, row2 := uuid.New(), uuid.New(), uuid.New()
	var noIDAt pglogrepl.LSN
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if err := outbox.Write(ctx, tx, outbox.Message{ID: row1, EventType: "mixed.row", Payload: map[string]int{"n": 1}}); err != nil {
			return err
		}
		if err := outbox.Emit(ctx, tx, outbox.Message{ID: withID, AggregateType: "order", AggregateID: "o-1",
			EventType: "mixed.message", Payload: map[string]int{"n": 2}, Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}); err != nil {
			return err
		}
		noIDAt = emitSQL(t, tx, true, "outbox", `{"event_type": "mixed.anonymous", "payload": {"n": 3}}`)
		emitSQL(t, tx, true, "someone.else", `{"event_type": "not.ours"}`)
		return outbox.Write(ctx, tx, outbox.Message{ID: row2, EventType: "mixed.row", Payload: map[string]int{"n": 4}})
	})
	if err != nil {
		t.Fatal(err)
	}

	// Refused, each in a transaction of its own that goes on to commit a
	// row: the stream goes on.
	var nonTxAt pglogrepl.LSN
	refusedTx := func(f func(tx pgx.Tx)) uuid.UUID {
		after := uuid.New()
		if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			f(tx)
			return outbox.Write(ctx, tx, outbox.Message{ID: after, EventType: "after.refused"})
		}); err != nil {
			t.Fatal(err)
		}
		return after
	}
	afters := []uuid.UUID{
		refusedTx(func(tx pgx.Tx) { nonTxAt = emitSQL(t, tx, false, "outbox", `{"event_type": "non.transactional"}`) }),
		refusedTx(func(tx pgx.Tx) { emitSQL(t, tx, true, "outbox", `this is not JSON`) }),
		refusedTx(func(tx pgx.Tx) { emitSQL(t, tx, true, "outbox", `{"payload": {"no": "event_type"}}`) }),
	}
	// A non-transactional message whose transaction rolls back is still
	// written, and still refused.
	tx, err = db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rolledNonTx := emitSQL(t, tx, false, "outbox", `{"event_type": "non.transactional.rolled.back"}`)
	tx.Rollback(ctx)
	last := writeEvents(t, db.Pool, 1, "last")[0]
	waitHandled(t, db.Pool, "the row after everything", []uuid.UUID{last})
	// The sink keeps a batch's events once its transaction committed: wait
	// for the last one there too.
	testkit.WaitFor(t, 10*time.Second, "the sink to keep the last batch", func() bool {
		return slices.ContainsFunc(sink.kept(), func(e outbox.Event) bool { return e.ID == last })
	})

	var evs []outbox.Event
	for _, e := range sink.kept() {
		if e.EventType != "" && strings.HasPrefix(e.EventType, "research_brief") {
			continue
		}
		evs = append(evs, e)
	}
	byType := map[string][]outbox.Event{}
	for _, e := range evs {
		byType[e.EventType] = append(byType[e.EventType], e)
	}
	if len(byType["rolled.back"]) != 0 || len(byType["not.ours"]) != 0 {
		t.Fatalf("a rolled-back or foreign message was handed over: %+v", evs)
	}

	// The mixed transaction, in order, once.
	var mixed []outbox.Event
	for _, e := range evs {
		if strings.HasPrefix(e.EventType, "mixed.") {
			mixed = append(mixed, e)
		}
	}
	if len(mixed) != 4 {
		t.Fatalf("the mixed transaction handed over %d events, want 4: %+v", len(mixed), mixed)
	}
	commit := pglogrepl.LSN(mixed[0].LSN)
	wantNoID := cdc.MessageEventID(commit, noIDAt)
	for i, want := range []uuid.UUID{row1, withID, wantNoID, row2} {
		e := mixed[i]
		if e.ID != want || e.Poison != "" || pglogrepl.LSN(e.LSN) != commit {
			t.Errorf("event %d of the mixed transaction: id %s lsn %s poison %q, want id %s at %s", i, e.ID, pglogrepl.LSN(e.LSN), e.Poison, want, commit)
		}
		if e.Message != (i == 1 || i == 2) {
			t.Errorf("event %d: Message %v", i, e.Message)
		}
	}
	if m := mixed[1]; m.AggregateID != "o-1" || string(m.Payload) != `{"n":2}` || !strings.Contains(string(m.Headers), "4bf92f3577b34da6a3ce929d0e0e4736") || m.Xid == 0 || m.CreatedAt.IsZero() {
		t.Errorf("the message with an id decoded as %+v", m)
	}
	if m := mixed[2]; m.RawID != wantNoID.String() || string(m.Payload) != `{"n": 3}` {
		t.Errorf("the message without an id decoded as %+v", m)
	}
	mu.Lock()
	if !failed || len(firstIDs) != 4 || firstIDs[2] != wantNoID {
		t.Errorf("the first reading of the mixed transaction had ids %v, want the same as the replay's (%s third)", firstIDs, wantNoID)
	}
	mu.Unlock()

	// The refused ones.
	for typ, want := range map[string]string{
		"non.transactional":             "non-transactional",
		"non.transactional.rolled.back": "non-transactional",
	} {
		if got := byType[typ]; len(got) != 1 || !got[0].Message || !strings.Contains(got[0].Poison, want) {
			t.Errorf("%s: %+v, want one refused event saying %q", typ, got, want)
		}
	}
	for at, typ := range map[pglogrepl.LSN]string{nonTxAt: "non.transactional", rolledNonTx: "non.transactional.rolled.back"} {
		if got := byType[typ]; len(got) == 1 && (pglogrepl.LSN(got[0].LSN) != at || got[0].ID != cdc.MessageEventID(at, at)) {
			t.Errorf("%s: at %s with id %s, want at %s with the id of its position", typ, pglogrepl.LSN(got[0].LSN), got[0].ID, at)
		}
	}
	var notJSON, noType int
	for _, e := range evs {
		switch {
		case e.Message && strings.Contains(e.Poison, "not JSON"):
			notJSON++
			if e.Raw["content"] != "this is not JSON" || e.Raw["transactional"] != true {
				t.Errorf("the refused message keeps %v", e.Raw)
			}
		case e.Message && strings.Contains(e.Poison, "no event_type"):
			noType++
		}
	}
	if notJSON != 1 || noType != 1 {
		t.Errorf("refused: %d not JSON, %d without event_type; want 1 each", notJSON, noType)
	}
	assertExactlyOnce(t, db.Pool, append(afters, row1, withID, wantNoID, row2, last))
}

// A message prefix equal to the heartbeat's is refused.
func TestMessagePrefixIsNotTheHeartbeats(t *testing.T) {
	t.Parallel()
	_, err := cdc.NewStream(cdc.Config{DatabaseURL: "postgres://localhost/x", MessagePrefix: cdc.HeartbeatPrefix}, cdc.SinkFunc(nil))
	if !errors.Is(err, cdc.ErrConfig) || !strings.Contains(err.Error(), "MessagePrefix") {
		t.Fatalf("NewStream: %v", err)
	}
}
