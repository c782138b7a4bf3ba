package outbox_test

import (
	"strings"
	"testing"

	"github.com/compensa/compensa/outbox"
)

// hostileNames are identifiers an operator might pass, on purpose or not.
var hostileNames = []string{
	"outbox", "public.outbox", `"My Schema"."Out.box"`, `"a""b"`, `x; DROP TABLE outbox; --`,
	`"x; DROP TABLE outbox; --"`, `a.b.c`, `"unterminated`, `""`, `.`, `a.`, `.a`, `"a"b`, "a\x00b",
	"Überweisung", "\xff\xfe", `"` + strings.Repeat("x", 64) + `"`, "$1", "1abc", "a b", `"a"."b"`,
	`"Chaos; DROP TABLE outbox; --"."Out ""box"""`, "ÉTA.Outbox",
}

// FuzzParseTableName: a name is refused with a message, or accepted; an
// accepted name has one or two non-empty parts of at most 63 bytes without
// NUL, its Quoted form reads back as the same name (so SQL built from it
// names exactly that table), and unquoted parts fold to lower case the way
// PostgreSQL folds them: ASCII letters only, every other byte kept.
func FuzzParseTableName(f *testing.F) {
	for _, s := range hostileNames {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tn, err := outbox.ParseTableName(s)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("refused without a message")
			}
			return
		}
		for _, p := range []string{tn.Schema, tn.Name} {
			if len(p) > 63 || strings.ContainsRune(p, 0) {
				t.Fatalf("accepted part %q (%d bytes)", p, len(p))
			}
		}
		if tn.Name == "" {
			t.Fatalf("accepted %q with an empty name", s)
		}
		back, err := outbox.ParseTableName(tn.Quoted())
		if err != nil || back != tn {
			t.Fatalf("%q → %+v → %s → %+v, %v", s, tn, tn.Quoted(), back, err)
		}
		if !strings.Contains(s, `"`) {
			want := strings.Split(postgresFold(s), ".")
			got := []string{tn.Name}
			if tn.Schema != "" {
				got = []string{tn.Schema, tn.Name}
			}
			if strings.Join(got, "\x00") != strings.Join(want, "\x00") {
				t.Fatalf("%q folds to %q, PostgreSQL folds it to %q", s, got, want)
			}
		}
	})
}

// postgresFold is PostgreSQL's downcase_identifier for a multibyte server
// encoding: only ASCII A-Z change.
func postgresFold(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// FuzzParseColumnMap: a map is refused with a message that names
// --outbox-columns, or accepted; an accepted map names a column for every
// field, each column a single identifier of at most 63 bytes without NUL,
// and written back with every column double-quoted it reads as the same map.
func FuzzParseColumnMap(f *testing.F) {
	for _, s := range []string{"", "id=id,event_type=type,payload=payload,aggregate_type=aggregatetype,aggregate_id=aggregateid",
		`payload="Pay ""load"""`, `payload="a,b"`, "payload=x;drop", "nonsense=x", "payload=a,payload=b", "payload=",
		"=x", "payload", `created_at="At; DROP TABLE outbox; --"`, "payload=a.b", " id = Id ", "id=\x00",
		"payload=Überweisung", "payload=\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := outbox.ParseColumnMap(s)
		if err != nil {
			if !strings.Contains(err.Error(), "--outbox-columns") {
				t.Fatalf("error %q does not name --outbox-columns", err)
			}
			return
		}
		var pairs []string
		for _, field := range outbox.Fields {
			col := m[field]
			if col == "" || len(col) > 63 || strings.ContainsRune(col, 0) {
				t.Fatalf("%q: field %s maps to %q", s, field, col)
			}
			if strings.Contains(col, ",") {
				t.Fatalf("%q: column %q holds a comma, which the flag's syntax cannot carry", s, col)
			}
			pairs = append(pairs, field+`="`+strings.ReplaceAll(col, `"`, `""`)+`"`)
		}
		if len(m) != len(outbox.Fields) {
			t.Fatalf("%q: map has %d entries, want %d", s, len(m), len(outbox.Fields))
		}
		back, err := outbox.ParseColumnMap(strings.Join(pairs, ","))
		if err != nil {
			t.Fatalf("%q: written back as %q: %v", s, strings.Join(pairs, ","), err)
		}
		for _, field := range outbox.Fields {
			if back[field] != m[field] {
				t.Fatalf("%q: field %s reads back as %q, want %q", s, field, back[field], m[field])
			}
		}
	})
}
