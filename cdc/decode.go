package cdc

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"

	"github.com/compensa/compensa/outbox"
)

// value is one column of one row, in PostgreSQL's text form. data may point
// into a buffer the connection reuses: buildEvent copies what it keeps.
type value struct {
	present   bool // the table has the column
	null      bool
	unchanged bool // an unchanged TOASTed value the server did not send
	data      []byte
}

// relation is one entry of the per-connection relation cache.
type relation struct {
	ours bool
	// col[f] is the column index of field f in the relation's tuples, -1 when
	// the field is not mapped, or when the column has gone since start
	// (then gone[f] says so).
	col  [nFields]int
	gone [nFields]bool
	typ  [nFields]uint32
}

// relations is the relation cache of one replication connection: pgoutput
// describes each relation once per connection (and again after it changes),
// then refers to it by id.
type relations struct {
	table *tableInfo
	byID  map[uint32]*relation
}

func newRelations(t *tableInfo) *relations {
	return &relations{table: t, byID: map[uint32]*relation{}}
}

func (rs *relations) add(m *pglogrepl.RelationMessage) {
	r := &relation{ours: m.Namespace == rs.table.name.Schema && m.RelationName == rs.table.name.Name}
	for f := range nFields {
		r.col[f] = -1
	}
	if r.ours {
		for f := range nFields {
			name := rs.table.fieldCol[f]
			if name == "" {
				continue
			}
			r.gone[f] = true
			for i, c := range m.Columns {
				if c.Name == name {
					r.col[f], r.gone[f] = i, false
					r.typ[f] = c.DataType
					if !knownOID(c.DataType) {
						// A domain: decode by the base type the catalog named.
						r.typ[f] = rs.table.cols[name].baseOID
					}
					break
				}
			}
		}
	}
	rs.byID[m.RelationID] = r
}

func (rs *relations) get(id uint32) (*relation, error) {
	r, ok := rs.byID[id]
	if !ok {
		return nil, errorf(ErrProtocol, "an insert refers to relation id %d, which this connection never described", id)
	}
	return r, nil
}

func knownOID(oid uint32) bool {
	switch oid {
	case oidBytea, oidText, oidJSON, oidVarchar, oidTimestamp, oidTimestamptz, oidUUID, oidJSONB:
		return true
	}
	return false
}

// tupleColumn is one column of an insert's tuple: its kind (pgoutput's
// TupleDataType) and, for a value, its bytes inside the message.
type tupleColumn struct {
	kind byte
	data []byte
}

// parseInsert reads a pgoutput Insert message ('I', relation id, 'N', the
// tuple) into cols, reused across messages. The values are not copied: they
// point into data, which belongs to the connection's buffer, and buildEvent
// copies what it keeps. The stream reads one such message per outbox row,
// and pglogrepl's parser allocates twice per column.
func parseInsert(data []byte, cols []tupleColumn) (uint32, []tupleColumn, error) {
	if len(data) < 8 || data[0] != byte(pglogrepl.MessageTypeInsert) {
		return 0, cols, errorf(ErrProtocol, "an insert message of %d bytes", len(data))
	}
	rel := binary.BigEndian.Uint32(data[1:5])
	if data[5] != 'N' {
		return 0, cols, errorf(ErrProtocol, "an insert's tuple marked %q, want 'N'", data[5])
	}
	n := int(binary.BigEndian.Uint16(data[6:8]))
	p := 8
	cols = cols[:0]
	for range n {
		if p >= len(data) {
			return 0, cols, errorf(ErrProtocol, "an insert's tuple ends after %d of its %d columns", len(cols), n)
		}
		c := tupleColumn{kind: data[p]}
		p++
		switch c.kind {
		case pglogrepl.TupleDataTypeNull, pglogrepl.TupleDataTypeToast:
		case pglogrepl.TupleDataTypeText, pglogrepl.TupleDataTypeBinary:
			if len(data)-p < 4 {
				return 0, cols, errorf(ErrProtocol, "an insert's column %d has no length", len(cols)+1)
			}
			l := binary.BigEndian.Uint32(data[p:])
			p += 4
			if uint64(l) > uint64(len(data)-p) {
				return 0, cols, errorf(ErrProtocol, "an insert's column %d claims %d bytes, %d remain", len(cols)+1, l, len(data)-p)
			}
			c.data = data[p : p+int(l) : p+int(l)]
			p += int(l)
		default:
			return 0, cols, errorf(ErrProtocol, "unknown tuple column kind %q", c.kind)
		}
		cols = append(cols, c)
	}
	return rel, cols, nil
}

// rowFromTuple picks the mapped fields out of an insert's tuple.
func (r *relation) rowFromTuple(t []tupleColumn) (row [nFields]value, err error) {
	for f := range nFields {
		i := r.col[f]
		if i < 0 {
			continue
		}
		if i >= len(t) {
			return row, errorf(ErrProtocol, "an insert has %d columns, its relation %d", len(t), i+1)
		}
		c := &t[i]
		v := value{present: true}
		switch c.kind {
		case pglogrepl.TupleDataTypeNull:
			v.null = true
		case pglogrepl.TupleDataTypeToast:
			v.unchanged = true
		default:
			v.data = c.data
		}
		row[f] = v
	}
	return row, nil
}

// buildEvent turns a row into an Event. A row that cannot be used gets a
// Poison reason (and Raw, for the dead letter); it is never an error.
func buildEvent(row *[nFields]value, typ *[nFields]uint32, gone *[nFields]bool, lsn uint64) outbox.Event {
	ev := outbox.Event{LSN: lsn, TenantID: outbox.NilTenant}
	var bad []string
	text := func(f int) (string, bool) {
		v := &row[f]
		switch {
		case gone != nil && gone[f]:
			bad = append(bad, fmt.Sprintf("column for %s is no longer in the table", outbox.Fields[f]))
			ev.Unread = append(ev.Unread, outbox.Fields[f])
			return "", false
		case !v.present || v.null:
			return "", false
		case v.unchanged:
			bad = append(bad, fmt.Sprintf("%s was not sent (unchanged TOAST value)", outbox.Fields[f]))
			ev.Unread = append(ev.Unread, outbox.Fields[f])
			return "", false
		}
		return string(v.data), true
	}
	if s, ok := text(fID); ok && s != "" {
		ev.RawID = s
		ev.ID = outbox.EventIDFromText(s)
	} else {
		bad = append(bad, "id is null or empty")
	}
	ev.AggregateType, _ = text(fAggregateType)
	ev.AggregateID, _ = text(fAggregateID)
	if ev.EventType, _ = text(fEventType); ev.EventType == "" {
		bad = append(bad, "event_type is null or empty")
	}
	// A database whose encoding is SQL_ASCII stores and sends any bytes as
	// text: such a value cannot be written back as text or JSON unchanged.
	for _, x := range []struct {
		f int
		s string
	}{{fID, ev.RawID}, {fAggregateType, ev.AggregateType}, {fAggregateID, ev.AggregateID}, {fEventType, ev.EventType}} {
		if !utf8.ValidString(x.s) {
			bad = append(bad, outbox.Fields[x.f]+" "+strconv.Quote(clip(x.s))+" is not valid UTF-8")
		}
	}
	if s, ok := text(fTenantID); ok {
		if u, err := uuid.Parse(s); err == nil {
			ev.TenantID = u
		} else {
			bad = append(bad, "tenant_id "+strconv.Quote(clip(s))+" is not a UUID")
		}
	}
	for _, x := range []struct {
		f   int
		dst *uuid.NullUUID
	}{{fCorrelationID, &ev.CorrelationID}, {fCausationID, &ev.CausationID}} {
		if s, ok := text(x.f); ok {
			if u, err := uuid.Parse(s); err == nil {
				*x.dst = uuid.NullUUID{UUID: u, Valid: true}
			} else {
				bad = append(bad, outbox.Fields[x.f]+" "+strconv.Quote(clip(s))+" is not a UUID")
			}
		}
	}
	switch p, reason := jsonField(row, typ, gone, fPayload); {
	case reason != "":
		bad = append(bad, reason)
		if ev.RawPayload = p; p == nil {
			ev.Unread = append(ev.Unread, outbox.Fields[fPayload])
		}
	case p == nil:
		bad = append(bad, "payload is null")
	default:
		ev.Payload = p
		ev.PayloadJSONB = typ[fPayload] == oidJSONB
	}
	if h, reason := jsonField(row, typ, gone, fHeaders); reason != "" {
		bad = append(bad, reason)
		if h == nil {
			ev.Unread = append(ev.Unread, outbox.Fields[fHeaders])
		}
	} else {
		ev.Headers = h
	}
	if s, ok := text(fCreatedAt); ok {
		ev.CreatedAt = parseTimestamp(s)
	}
	if len(bad) > 0 {
		ev.Poison = strings.Join(bad, "; ")
		ev.Raw = rawRow(row)
	}
	return ev
}

// jsonField returns a JSON field's bytes (a copy), nil for NULL, or why the
// relay cannot use them as JSON (with the bytes when they could be read, nil
// when not): text and bytea must be JSON, and every value must be UTF-8 and
// nest no deeper than outbox.MaxJSONDepth.
func jsonField(row *[nFields]value, typ *[nFields]uint32, gone *[nFields]bool, f int) (json.RawMessage, string) {
	v := &row[f]
	name := outbox.Fields[f]
	switch {
	case gone != nil && gone[f]:
		return nil, fmt.Sprintf("column for %s is no longer in the table", name)
	case !v.present || v.null:
		return nil, ""
	case v.unchanged:
		return nil, name + " was not sent (unchanged TOAST value)"
	}
	// json and jsonb values are JSON by construction, but PostgreSQL nests
	// them deeper than the relay can re-encode, and a SQL_ASCII database
	// holds bytes that are not UTF-8 in them: such a value is poison.
	switch typ[f] {
	case oidJSONB, oidJSON:
		b := bytes.Clone(v.data)
		if err := outbox.CheckEncodable(b); err != nil {
			return b, name + " " + err.Error()
		}
		return b, ""
	case oidBytea:
		b, err := decodeBytea(v.data)
		if err != nil {
			return bytes.Clone(v.data), name + " (bytea) cannot be decoded: " + err.Error()
		}
		if err := validJSON(b); err != nil {
			return b, name + " (bytea) is not JSON text: " + err.Error()
		}
		if err := outbox.CheckEncodable(b); err != nil {
			return b, name + " (bytea) " + err.Error()
		}
		return b, ""
	default:
		b := bytes.Clone(v.data)
		if err := validJSON(b); err != nil {
			return b, name + " is not valid JSON: " + err.Error()
		}
		if err := outbox.CheckEncodable(b); err != nil {
			return b, name + " " + err.Error()
		}
		return b, ""
	}
}

func validJSON(b []byte) error {
	if json.Valid(b) {
		return nil
	}
	var x any
	err := json.Unmarshal(b, &x)
	if err == nil {
		err = fmt.Errorf("invalid JSON")
	}
	return err
}

// decodeBytea reads bytea's text output, hex ("\x..") or escape format.
func decodeBytea(s []byte) ([]byte, error) {
	if bytes.HasPrefix(s, []byte(`\x`)) {
		out := make([]byte, hex.DecodedLen(len(s)-2))
		_, err := hex.Decode(out, s[2:])
		return out, err
	}
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			out = append(out, s[i])
			continue
		}
		if i+1 < len(s) && s[i+1] == '\\' {
			out = append(out, '\\')
			i++
			continue
		}
		if i+3 >= len(s) {
			return nil, fmt.Errorf("truncated escape at byte %d", i)
		}
		n, err := strconv.ParseUint(string(s[i+1:i+4]), 8, 8)
		if err != nil {
			return nil, fmt.Errorf("bad escape at byte %d", i)
		}
		out = append(out, byte(n))
		i += 3
	}
	return out, nil
}

var timestampLayouts = []string{
	"2006-01-02 15:04:05.999999999-07",
	"2006-01-02 15:04:05.999999999-07:00",
	"2006-01-02 15:04:05.999999999-07:00:00",
	"2006-01-02 15:04:05.999999999",
}

// parseTimestamp reads timestamptz/timestamp output under DateStyle ISO (the
// stream sets it on its connections); a timestamp without zone is UTC. What
// it cannot read (infinity, BC dates) is the zero time.
func parseTimestamp(s string) time.Time {
	if t, ok := parseUTCTimestamp(s); ok {
		return t
	}
	for _, l := range timestampLayouts {
		if t, err := time.Parse(l, s); err == nil {
			return t.UTC()
		}
	}
	return time.Time{}
}

func rawRow(row *[nFields]value) map[string]any {
	raw := make(map[string]any, nFields)
	for f := range nFields {
		v := &row[f]
		if !v.present {
			continue
		}
		if v.null || v.unchanged {
			raw[outbox.Fields[f]] = nil
			continue
		}
		raw[outbox.Fields[f]] = string(v.data)
	}
	return raw
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// parseUTCTimestamp reads the form a timestamptz takes under TimeZone UTC,
// "2006-01-02 15:04:05[.fraction]+00", without time.Parse's layout
// matching: the stream reads one per outbox row. It reports false for any
// other form.
func parseUTCTimestamp(s string) (time.Time, bool) {
	if len(s) < 22 || s[4] != '-' || s[7] != '-' || s[10] != ' ' || s[13] != ':' || s[16] != ':' {
		return time.Time{}, false
	}
	num := func(from, to int) int {
		n := 0
		for i := from; i < to; i++ {
			c := s[i]
			if c < '0' || c > '9' {
				return -1
			}
			n = n*10 + int(c-'0')
		}
		return n
	}
	year, month, day := num(0, 4), num(5, 7), num(8, 10)
	hour, minute, sec := num(11, 13), num(14, 16), num(17, 19)
	if year < 0 || month < 1 || month > 12 || day < 1 || hour < 0 || hour > 23 || minute < 0 || minute > 59 || sec < 0 || sec > 59 {
		return time.Time{}, false
	}
	i, nsec := 19, 0
	if s[i] == '.' {
		i++
		start := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			nsec = nsec*10 + int(s[i]-'0')
			i++
		}
		digits := i - start
		if digits == 0 || digits > 9 {
			return time.Time{}, false
		}
		for ; digits < 9; digits++ {
			nsec *= 10
		}
	}
	if s[i:] != "+00" {
		return time.Time{}, false
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC)
	if t.Day() != day {
		return time.Time{}, false // a day the month does not have
	}
	return t, true
}
