package outbox

import (
	"fmt"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
)

// TableName is a possibly schema-qualified table name.
type TableName struct {
	Schema string // empty: the search path decides
	Name   string
}

// ParseTableName parses `name`, `schema.name` or their double-quoted forms
// (`"My Schema"."Out.box"`). It refuses what it cannot read unambiguously.
func ParseTableName(s string) (TableName, error) {
	parts, err := splitIdent(s)
	if err != nil {
		return TableName{}, fmt.Errorf("outbox table %q: %w", s, err)
	}
	switch len(parts) {
	case 1:
		return TableName{Name: parts[0]}, nil
	case 2:
		return TableName{Schema: parts[0], Name: parts[1]}, nil
	default:
		return TableName{}, fmt.Errorf("outbox table %q: want name or schema.name, got %d parts", s, len(parts))
	}
}

// Quoted returns the name quoted for SQL.
func (t TableName) Quoted() string {
	if t.Schema == "" {
		return pgx.Identifier{t.Name}.Sanitize()
	}
	return pgx.Identifier{t.Schema, t.Name}.Sanitize()
}

func (t TableName) String() string {
	if t.Schema == "" {
		return t.Name
	}
	return t.Schema + "." + t.Name
}

// splitIdent splits a dotted identifier, honouring double quotes ("" inside
// quotes is a quote). Unquoted parts are folded to lower case, as PostgreSQL
// does.
func splitIdent(s string) ([]string, error) {
	if strings.ContainsRune(s, 0) {
		return nil, fmt.Errorf("contains a NUL byte")
	}
	var parts []string
	i := 0
	for {
		if i >= len(s) {
			return nil, fmt.Errorf("empty name part")
		}
		var part strings.Builder
		if s[i] == '"' {
			i++
			closed := false
			for i < len(s) {
				if s[i] == '"' {
					if i+1 < len(s) && s[i+1] == '"' {
						part.WriteByte('"')
						i += 2
						continue
					}
					i++
					closed = true
					break
				}
				part.WriteByte(s[i])
				i++
			}
			if !closed {
				return nil, fmt.Errorf("unterminated double quote")
			}
			if part.Len() == 0 {
				return nil, fmt.Errorf("empty quoted name")
			}
		} else {
			start := i
			for i < len(s) && s[i] != '.' {
				c := s[i]
				if !(c == '_' || c == '$' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80) {
					return nil, fmt.Errorf("character %q is not allowed in an unquoted name: quote the name with double quotes", c)
				}
				i++
			}
			if i == start {
				return nil, fmt.Errorf("empty name part")
			}
			if c := s[start]; c >= '0' && c <= '9' || c == '$' {
				return nil, fmt.Errorf("an unquoted name cannot start with %q", c)
			}
			// PostgreSQL folds only ASCII letters of an unquoted name (in
			// a multibyte server encoding); strings.ToLower would also fold
			// "Ü" and mangle invalid UTF-8, naming another table.
			for _, c := range []byte(s[start:i]) {
				if c >= 'A' && c <= 'Z' {
					c += 'a' - 'A'
				}
				part.WriteByte(c)
			}
		}
		if part.Len() > 63 {
			return nil, fmt.Errorf("name part longer than 63 bytes")
		}
		parts = append(parts, part.String())
		if i == len(s) {
			return parts, nil
		}
		if s[i] != '.' {
			return nil, fmt.Errorf("unexpected %q after a quoted name", s[i])
		}
		i++
	}
}

// Fields are our names for the outbox columns, in the order the default
// table declares them.
var Fields = []string{"id", "tenant_id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers", "correlation_id", "causation_id", "created_at"}

// ColumnMap maps our field names to the columns of an outbox table.
type ColumnMap map[string]string

// DefaultColumns maps every field to the column of the same name.
func DefaultColumns() ColumnMap {
	m := ColumnMap{}
	for _, f := range Fields {
		m[f] = f
	}
	return m
}

// ParseColumnMap reads `field=column,field=column`. Fields left out keep their
// default column names. An unknown field, a duplicate or an empty column is an
// error that names it.
func ParseColumnMap(s string) (ColumnMap, error) {
	m := DefaultColumns()
	if strings.TrimSpace(s) == "" {
		return m, nil
	}
	known := map[string]bool{}
	for _, f := range Fields {
		known[f] = true
	}
	seen := map[string]bool{}
	for _, pair := range strings.Split(s, ",") {
		field, col, ok := strings.Cut(strings.TrimSpace(pair), "=")
		field, col = strings.TrimSpace(field), strings.TrimSpace(col)
		if !ok || field == "" || col == "" {
			return nil, fmt.Errorf("--outbox-columns: %q is not field=column", pair)
		}
		if !known[field] {
			fs := append([]string(nil), Fields...)
			sort.Strings(fs)
			return nil, fmt.Errorf("--outbox-columns: unknown field %q (known: %s)", field, strings.Join(fs, ", "))
		}
		if seen[field] {
			return nil, fmt.Errorf("--outbox-columns: field %q given twice", field)
		}
		seen[field] = true
		parts, err := splitIdent(col)
		if err != nil || len(parts) != 1 {
			if err == nil {
				err = fmt.Errorf("a column name cannot be qualified")
			}
			return nil, fmt.Errorf("--outbox-columns: column for %q: %v", field, err)
		}
		m[field] = parts[0]
	}
	return m, nil
}
