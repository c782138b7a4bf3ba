package cdc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// insertMessage builds a pgoutput Insert message for relation rel.
func insertMessage(rel uint32, cols ...tupleColumn) []byte {
	m := []byte{'I'}
	m = binary.BigEndian.AppendUint32(m, rel)
	m = append(m, 'N')
	m = binary.BigEndian.AppendUint16(m, uint16(len(cols)))
	for _, c := range cols {
		m = append(m, c.kind)
		if c.kind == 't' || c.kind == 'b' {
			m = binary.BigEndian.AppendUint32(m, uint32(len(c.data)))
			m = append(m, c.data...)
		}
	}
	return m
}

// The stream's own reading of an insert gives what pgoutput sent, and a
// message cut anywhere, or with a column kind pgoutput does not send, is a
// protocol error, never a panic or a value read past the message.
func TestParseInsert(t *testing.T) {
	want := []tupleColumn{{kind: 't', data: []byte("7e2b")}, {kind: 'n'}, {kind: 'u'}, {kind: 'b', data: []byte{0, 1}}, {kind: 't', data: []byte{}}}
	msg := insertMessage(16390, want...)
	rel, got, err := parseInsert(msg, nil)
	if err != nil || rel != 16390 || len(got) != len(want) {
		t.Fatalf("parseInsert: rel %d, %d columns, err %v", rel, len(got), err)
	}
	for i := range want {
		if got[i].kind != want[i].kind || !bytes.Equal(got[i].data, want[i].data) || (want[i].data == nil) != (got[i].data == nil) {
			t.Fatalf("column %d: %q %q, want %q %q", i, got[i].kind, got[i].data, want[i].kind, want[i].data)
		}
	}
	for n := range len(msg) {
		if _, _, err := parseInsert(msg[:n], got); !errors.Is(err, ErrProtocol) {
			t.Fatalf("message cut to %d of %d bytes: err %v, want ErrProtocol", n, len(msg), err)
		}
	}
	bad := insertMessage(1, tupleColumn{kind: 'x'})
	if _, _, err := parseInsert(bad, nil); !errors.Is(err, ErrProtocol) {
		t.Fatalf("unknown column kind: err %v", err)
	}
	long := insertMessage(1, tupleColumn{kind: 't', data: []byte("abc")})
	binary.BigEndian.PutUint32(long[10:], 1<<31)
	if _, _, err := parseInsert(long, nil); !errors.Is(err, ErrProtocol) {
		t.Fatalf("a length past the message: err %v", err)
	}
	if _, _, err := parseInsert(append(insertMessage(1)[:5], 'K', 0, 0), nil); !errors.Is(err, ErrProtocol) {
		t.Fatalf("a tuple not marked N: err %v", err)
	}
}
