package cdc

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
)

// Transactions read while the sink is busy are read into the pending batch's
// unused room and merged without a copy. A batch handed over meanwhile, even
// while a transaction is being read into the room right after its events,
// keeps exactly its own events, in order, and cannot grow into that room.
func TestTransactionsReadIntoThePendingBatchReachTheSinkIntact(t *testing.T) {
	ctx := context.Background()
	s := &Stream{cfg: Config{Slot: "room", StatusInterval: time.Hour}.WithDefaults(), log: slog.New(slog.DiscardHandler)}
	r := &receiver{s: s, rels: newRelations(defaultTableInfo()), batches: make(chan Batch, 1),
		nextStatus: time.Now().Add(time.Hour)}
	feed := func(msgs ...[]byte) {
		t.Helper()
		for _, m := range msgs {
			if err := r.message(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
	}
	var ids []string
	lsn := uint64(0x1000)
	row := func() []byte {
		id := uuid.NewString()
		ids = append(ids, id)
		return encInsert(16384, sp(id), nil, sp("order"), sp(fmt.Sprint(len(ids))), sp("k"),
			sp(fmt.Sprintf(`{"n": %d}`, len(ids))), nil, nil, nil, sp("2026-12-01 22:25:18.5+00"))
	}
	tx := func(rows int) {
		t.Helper()
		lsn += 0x100
		feed(encBegin(lsn, uint32(lsn)))
		for range rows {
			feed(row())
		}
		feed(encCommit(lsn, lsn+0x10))
	}
	feed(encRelation(16384, "public", "outbox", seedColumns))
	r.batches <- Batch{} // the sink is busy: batches stay pending
	for i := range 40 {
		tx(1 + i%3)
	}
	if r.pending == nil || len(r.pending.Events) != len(ids) {
		t.Fatalf("pending batch: %+v, want %d events", r.pending, len(ids))
	}
	// The next transaction begins and is read into the pending batch's room
	// when the sink frees up and takes the batch.
	lsn += 0x100
	feed(encBegin(lsn, uint32(lsn)), row())
	<-r.batches
	if !r.offer() {
		t.Fatal("the pending batch was not handed over")
	}
	first := <-r.batches
	handed := len(ids) - 1
	if len(first.Events) != handed || cap(first.Events) != handed || first.Transactions != 40 {
		t.Fatalf("handed over %d events (cap %d) of %d transactions, want %d", len(first.Events), cap(first.Events), first.Transactions, handed)
	}
	snapshot := append([]string(nil), rawIDs(first)...)
	r.batches <- Batch{} // busy again
	// A sink that appends to its batch gets a copy: the row read into the
	// room right after its events is not overwritten.
	_ = append(first.Events, first.Events[0])
	feed(row(), encCommit(lsn, lsn+0x10))
	for range 10 {
		tx(2)
	}
	<-r.batches
	if !r.offer() {
		t.Fatal("the second pending batch was not handed over")
	}
	second := <-r.batches
	if got := rawIDs(first); fmt.Sprint(got) != fmt.Sprint(snapshot) {
		t.Fatalf("the first batch changed after it was handed over")
	}
	got := append(rawIDs(first), rawIDs(second)...)
	if fmt.Sprint(got) != fmt.Sprint(ids) {
		t.Fatalf("events out of order, lost or overwritten:\n got %v\nwant %v", got, ids)
	}
	if second.Transactions != 11 || second.CommitLSN != pglogrepl.LSN(lsn) || second.EndLSN != pglogrepl.LSN(lsn+0x10) {
		t.Fatalf("second batch: %d transactions, commit %s, end %s", second.Transactions, second.CommitLSN, second.EndLSN)
	}
	for _, b := range []Batch{first, second} {
		for i := range b.Events {
			if ev := &b.Events[i]; ev.Poison != "" || !ev.PayloadJSONB || ev.LSN > uint64(b.CommitLSN) ||
				!ev.CreatedAt.Equal(time.Date(2026, 12, 1, 22, 25, 18, 5e8, time.UTC)) {
				t.Fatalf("event %d: %+v", i, ev)
			}
		}
	}
}

func rawIDs(b Batch) []string {
	out := make([]string, len(b.Events))
	for i := range b.Events {
		out[i] = b.Events[i].RawID
	}
	return out
}
