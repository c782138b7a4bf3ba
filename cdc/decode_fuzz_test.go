package cdc

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/compensa/compensa/outbox"
)

// FuzzPgoutputMessages feeds the receiver's pgoutput decoding (relation
// cache, transaction framing, tuple decoding, buildEvent) with arbitrary
// message sequences, as a replication connection would deliver them.
//
// The input is a sequence of frames, each a 2-byte big-endian length and that
// many bytes of one pgoutput message (the last frame takes what is left).
// Frames that pglogrepl.Parse itself cannot survive are skipped: that parser
// is a dependency without bounds checks, and a server only sends it what it
// encoded (see the report in RELIABILITY.md). Everything it parses must go
// through our code without a panic, and:
//
//   - every event handed over is either usable (an id, an event type, a JSON
//     payload) or poison with a reason and its raw row, for the dead letters;
//   - a partial batch's EndLSN is CommitLSN+1 (see Batch.EndLSN);
//   - an error is a kinded ErrProtocol, and ends the session;
//   - nothing kept aliases the connection's buffer: decoding from a buffer
//     that is scribbled over after each message gives the same batches.
func FuzzPgoutputMessages(f *testing.F) {
	for _, seed := range pgoutputSeeds() {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		frames := splitFrames(in)
		done := make(chan struct{})
		go func() {
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				panic(fmt.Sprintf("HANG on %q", in))
			}
		}()
		defer close(done)
		fresh, trusted, freshErr := decodeFrames(frames, false)
		reused, _, reusedErr := decodeFrames(frames, true)
		if (freshErr == nil) != (reusedErr == nil) {
			t.Fatalf("outcome depends on buffer reuse: %v vs %v", freshErr, reusedErr)
		}
		if freshErr != nil && !errors.Is(freshErr, ErrProtocol) {
			t.Fatalf("error without the ErrProtocol kind: %v", freshErr)
		}
		if !reflect.DeepEqual(fresh, reused) {
			t.Fatalf("events alias the connection's buffer:\nfresh  %+v\nreused %+v", fresh, reused)
		}
		for _, b := range fresh {
			if b.Partial && b.EndLSN != b.CommitLSN+1 {
				t.Fatalf("partial batch EndLSN %s, CommitLSN %s", b.EndLSN, b.CommitLSN)
			}
			for i := range b.Events {
				checkFuzzedEvent(t, &b.Events[i], trusted)
			}
		}
	})
}

// checkFuzzedEvent checks one decoded event. trusted is set when some
// relation declared the payload or headers column json or jsonb: the server
// validated those values, and the decoder rightly takes them as they are.
func checkFuzzedEvent(t *testing.T, ev *outbox.Event, trusted bool) {
	t.Helper()
	if ev.Poison != "" {
		if ev.Raw == nil {
			t.Fatalf("poison event without its raw row: %q", ev.Poison)
		}
		if _, err := json.Marshal(ev.Raw); err != nil {
			t.Fatalf("raw row cannot be encoded for the dead letters: %v", err)
		}
		return
	}
	switch {
	case ev.RawID == "" || ev.ID != outbox.EventIDFromText(ev.RawID):
		t.Fatalf("usable event with id %q / %s", ev.RawID, ev.ID)
	case ev.EventType == "":
		t.Fatal("usable event without an event type")
	case ev.Payload == nil:
		t.Fatal("usable event without a payload")
	case !trusted && !json.Valid(ev.Payload):
		t.Fatalf("usable event with a payload that is not JSON: %q", ev.Payload)
	case !trusted && ev.Headers != nil && !json.Valid(ev.Headers):
		t.Fatalf("usable event with headers that are not JSON: %q", ev.Headers)
	}
}

// splitFrames cuts the fuzz input into length-prefixed frames.
func splitFrames(in []byte) [][]byte {
	var out [][]byte
	for len(in) > 0 {
		if len(in) < 2 {
			out = append(out, in)
			break
		}
		n := int(binary.BigEndian.Uint16(in))
		in = in[2:]
		n = min(n, len(in))
		out = append(out, in[:n])
		in = in[n:]
	}
	return out
}

// parses reports whether pglogrepl.Parse returns (with or without an error)
// on data instead of panicking or allocating what a length field claims
// beyond the message's end (up to 4 GB per tuple column).
func parses(data []byte) (ok bool) {
	if len(data) == 0 || !lengthsFit(data) {
		return false
	}
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	_, _ = pglogrepl.Parse(data)
	return true
}

// lengthsFit checks the length fields pglogrepl allocates by: tuple column
// lengths in insert, update and delete messages, and a truncate's relation
// count.
func lengthsFit(m []byte) bool {
	tuple := func(at int) (int, bool) {
		if at+2 > len(m) {
			return 0, false
		}
		n := int(binary.BigEndian.Uint16(m[at:]))
		at += 2
		for range n {
			if at >= len(m) {
				return 0, false
			}
			kind := m[at]
			at++
			if kind == 't' || kind == 'b' {
				if at+4 > len(m) {
					return 0, false
				}
				l := int(binary.BigEndian.Uint32(m[at:]))
				at += 4
				if l > len(m)-at {
					return 0, false
				}
				at += l
			}
		}
		return at, true
	}
	switch m[0] {
	case 'I':
		_, ok := tuple(6)
		return ok
	case 'U':
		if len(m) < 6 {
			return false
		}
		at, ok := 5, true
		if m[at] == 'K' || m[at] == 'O' {
			if at, ok = tuple(at + 1); !ok || at >= len(m) {
				return false
			}
		}
		_, ok = tuple(at + 1)
		return ok
	case 'D':
		_, ok := tuple(6)
		return ok
	case 'T':
		return len(m) >= 5 && int(binary.BigEndian.Uint32(m[1:]))*4 <= len(m)
	}
	return true
}

// decodeFrames runs the frames through a receiver with no connection: status
// updates are an hour away, and batches go to a channel drained after each
// message. With reuse, each frame is copied into one buffer that is
// scribbled over once the receiver is done with it, as a connection's read
// buffer is.
func decodeFrames(frames [][]byte, reuse bool) (got []Batch, trusted bool, err error) {
	tbl := defaultTableInfo()
	s := &Stream{cfg: Config{Slot: "fuzz", MaxBatchEvents: 3, StatusInterval: time.Hour}.WithDefaults(),
		log: slog.New(slog.DiscardHandler)}
	r := &receiver{s: s, rels: newRelations(tbl), batches: make(chan Batch, 1),
		nextStatus: time.Now().Add(time.Hour)}
	var buf []byte
	ctx := context.Background()
	for _, fr := range frames {
		// Capacity cut to the length: pglogrepl slices a message's content
		// by its length field without a check, which only panics when the
		// slice runs past the capacity.
		if !parses(fr[:len(fr):len(fr)]) {
			continue
		}
		data := fr
		if reuse {
			buf = append(buf[:0], fr...)
			data = buf
		} else {
			data = append([]byte(nil), fr...)
		}
		err = r.message(ctx, data)
		for _, rel := range r.rels.byID {
			for _, f := range []int{fPayload, fHeaders} {
				if rel.ours && rel.col[f] >= 0 && (rel.typ[f] == oidJSON || rel.typ[f] == oidJSONB) {
					trusted = true
				}
			}
		}
		if reuse {
			for i := range buf {
				buf[i] = 0xA5
			}
		}
		select {
		case b := <-r.batches:
			got = append(got, b)
		default:
		}
		if err != nil {
			return got, trusted, err
		}
	}
	return got, trusted, nil
}

// defaultTableInfo is what inspectTable finds for the default outbox table.
func defaultTableInfo() *tableInfo {
	t := &tableInfo{name: outbox.TableName{Schema: "public", Name: "outbox"}, cols: map[string]columnInfo{}}
	bases := map[string]uint32{"id": oidUUID, "tenant_id": oidUUID, "aggregate_type": oidText, "aggregate_id": oidText,
		"event_type": oidText, "payload": oidJSONB, "headers": oidJSONB, "correlation_id": oidUUID,
		"causation_id": oidUUID, "created_at": oidTimestamptz}
	for f, name := range outbox.Fields {
		t.fieldCol[f] = name
		t.cols[name] = columnInfo{baseOID: bases[name]}
	}
	return t
}

// --- seeds: well-formed pgoutput messages, encoded as PostgreSQL does ---

type pgoutColumn struct {
	name string
	oid  uint32
}

var seedColumns = []pgoutColumn{
	{"id", oidUUID}, {"tenant_id", oidUUID}, {"aggregate_type", oidText}, {"aggregate_id", oidText},
	{"event_type", oidText}, {"payload", oidJSONB}, {"headers", oidJSONB}, {"correlation_id", oidUUID},
	{"causation_id", oidUUID}, {"created_at", oidTimestamptz},
}

func encRelation(id uint32, schema, name string, cols []pgoutColumn) []byte {
	b := []byte{'R'}
	b = binary.BigEndian.AppendUint32(b, id)
	b = append(append(b, schema...), 0)
	b = append(append(b, name...), 0)
	b = append(b, 'd')
	b = binary.BigEndian.AppendUint16(b, uint16(len(cols)))
	for _, c := range cols {
		b = append(b, 0)
		b = append(append(b, c.name...), 0)
		b = binary.BigEndian.AppendUint32(b, c.oid)
		b = binary.BigEndian.AppendUint32(b, 0xFFFFFFFF)
	}
	return b
}

func encBegin(final uint64, xid uint32) []byte {
	b := []byte{'B'}
	b = binary.BigEndian.AppendUint64(b, final)
	b = binary.BigEndian.AppendUint64(b, 7e14)
	return binary.BigEndian.AppendUint32(b, xid)
}

func encCommit(lsn, end uint64) []byte {
	b := []byte{'C', 0}
	b = binary.BigEndian.AppendUint64(b, lsn)
	b = binary.BigEndian.AppendUint64(b, end)
	return binary.BigEndian.AppendUint64(b, 7e14)
}

// encInsert encodes a tuple; a nil value is NULL, "\x00toast" an unchanged
// TOAST value.
func encInsert(rel uint32, vals ...*string) []byte {
	b := []byte{'I'}
	b = binary.BigEndian.AppendUint32(b, rel)
	b = append(b, 'N')
	b = binary.BigEndian.AppendUint16(b, uint16(len(vals)))
	for _, v := range vals {
		switch {
		case v == nil:
			b = append(b, 'n')
		case *v == "\x00toast":
			b = append(b, 'u')
		default:
			b = append(b, 't')
			b = binary.BigEndian.AppendUint32(b, uint32(len(*v)))
			b = append(b, *v...)
		}
	}
	return b
}

func encMessage(transactional bool, prefix, content string) []byte {
	b := []byte{'M', 0}
	if transactional {
		b[1] = 1
	}
	b = binary.BigEndian.AppendUint64(b, 0x1000)
	b = append(append(b, prefix...), 0)
	b = binary.BigEndian.AppendUint32(b, uint32(len(content)))
	return append(b, content...)
}

func joinFrames(msgs ...[]byte) []byte {
	var out []byte
	for _, m := range msgs {
		out = binary.BigEndian.AppendUint16(out, uint16(len(m)))
		out = append(out, m...)
	}
	return out
}

func sp(s string) *string { return &s }

func pgoutputSeeds() [][]byte {
	row := func(id, typ, payload string) []byte {
		return encInsert(16384, sp(id), sp("7d0a5c1e-3b7f-4e0b-9d3f-2a4d5e6f7a8b"), sp("research_brief"), sp("42"),
			sp(typ), sp(payload), sp(`{"trace": "x"}`), nil, nil, sp("2024-05-06 07:08:09.123456+00"))
	}
	rel := encRelation(16384, "public", "outbox", seedColumns)
	textCols := append([]pgoutColumn(nil), seedColumns...)
	textCols[0].oid, textCols[5].oid = oidText, oidText
	byteaCols := append([]pgoutColumn(nil), seedColumns...)
	byteaCols[5].oid = oidBytea
	domainCols := append([]pgoutColumn(nil), seedColumns...)
	domainCols[0].oid = 99999
	return [][]byte{
		joinFrames(rel, encBegin(0x2000, 1), row("0b7e6c2a-1f0e-4a57-9a43-5d2c1e6f8b90", "research_brief.created",
			`{"brief_id": "6f9619ff-8b86-d011-b42d-00cf4fc964ff"}`), encCommit(0x2000, 0x2030)),
		// several rows: more than MaxBatchEvents, so partial batches
		joinFrames(rel, encBegin(0x3000, 2), row("a", "t", `{}`), row("b", "t", `[1]`), row("c", "t", `"s"`),
			row("d", "t", `null`), encCommit(0x3000, 0x3040)),
		// poison: null id, empty type, broken JSON, unchanged TOAST, bad uuids
		joinFrames(rel, encBegin(0x4000, 3),
			encInsert(16384, nil, sp("not-a-uuid"), nil, nil, sp(""), sp(`{"a":`), sp("\x00toast"), sp("x"), nil, sp("infinity")),
			encCommit(0x4000, 0x4040)),
		// a text-id, text-payload relation (an existing outbox table)
		joinFrames(encRelation(16385, "public", "outbox", textCols), encBegin(0x5000, 4),
			encInsert(16385, sp("order-1"), nil, sp("Order"), sp("1"), sp("OrderCreated"), sp("not json {"), nil, nil, nil, nil),
			encCommit(0x5000, 0x5040)),
		// a bytea payload, hex and escape formats
		joinFrames(encRelation(16386, "public", "outbox", byteaCols), encBegin(0x6000, 5),
			encInsert(16386, sp("6f9619ff-8b86-d011-b42d-00cf4fc964ff"), nil, nil, nil, sp("k"), sp(`\x7b7d`), nil, nil, nil, nil),
			encInsert(16386, sp("6f9619ff-8b86-d011-b42d-00cf4fc964fe"), nil, nil, nil, sp("k"), sp(`\173\175\\`), nil, nil, nil, nil),
			encCommit(0x6000, 0x6040)),
		// a domain column and another table's relation
		joinFrames(encRelation(16387, "public", "outbox", domainCols), encRelation(17000, "app", "other", seedColumns[:2]),
			encBegin(0x7000, 6), encInsert(17000, sp("x"), sp("y")), encMessage(true, HeartbeatPrefix, "fuzz"),
			encCommit(0x7000, 0x7040)),
		// protocol errors: insert for an unknown relation, commit without begin
		joinFrames(encBegin(0x8000, 7), encInsert(1, sp("x")), encCommit(0x8000, 0x8040)),
		joinFrames(encCommit(0x9000, 0x9040), encBegin(0x9100, 8), encBegin(0x9200, 9)),
	}
}
