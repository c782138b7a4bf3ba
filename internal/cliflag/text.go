package cliflag

import (
	"errors"
	"net"
	"regexp"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/compensa/compensa/outbox"
)

// Text is a string flag with a form: a table name, a host:port.
type Text struct {
	p        *string
	typ      string
	want     string
	optional bool
	// check says why s is refused ("" when want says it all), or ok.
	check func(s string) (why string, ok bool)
}

// Optional makes the empty string acceptable too: nothing given, as when
// the flag is not (an address: no listener of its own).
func (t *Text) Optional() *Text {
	t.optional = true
	return t
}

func (t *Text) Set(s string) error {
	if s == "" && t.optional {
		*t.p = s
		return nil
	}
	if why, ok := t.check(s); !ok {
		if why != "" {
			return errors.New(t.want + " (" + why + ")")
		}
		return errors.New(t.want)
	}
	*t.p = s
	return nil
}

func (t *Text) Want() string   { return t.want }
func (t *Text) String() string { return *t.p }
func (t *Text) Type() string   { return t.typ }

func newText(p *string, def, typ, want string, check func(string) (string, bool)) *Text {
	*p = def
	return &Text{p: p, typ: typ, want: want, check: check}
}

// TableName is a table, schema-qualified or not, as outbox.ParseTableName
// reads it.
func TableName(p *string, def string) *Text {
	return newText(p, def, "table", "want a table name such as outbox or events.outbox", func(s string) (string, bool) {
		if _, err := outbox.ParseTableName(s); err != nil {
			return err.Error(), false
		}
		return "", true
	})
}

// ColumnMap is field=column,... as outbox.ParseColumnMap reads it.
func ColumnMap(p *string, def string) *Text {
	return newText(p, def, "columns", "want field=column,...", func(s string) (string, bool) {
		if _, err := outbox.ParseColumnMap(s); err != nil {
			// Its message names the flag, which the CLI names already.
			return strings.TrimPrefix(err.Error(), "--outbox-columns: "), false
		}
		return "", true
	})
}

// slotNameRE is what PostgreSQL accepts as a replication slot's name.
var slotNameRE = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// SlotName is a replication slot's name.
func SlotName(p *string, def string) *Text {
	return newText(p, def, "name", "want a replication slot name: 1 to 63 lower-case letters, digits or underscores", func(s string) (string, bool) {
		return "", slotNameRE.MatchString(s)
	})
}

// Address is a host:port to listen on, the port a number (":8080" listens
// on every interface).
func Address(p *string, def string) *Text {
	return newText(p, def, "host:port", "want host:port such as 127.0.0.1:8080 or :8080", func(s string) (string, bool) {
		_, port, err := net.SplitHostPort(s)
		if err == nil {
			_, err = strconv.ParseUint(port, 10, 16)
		}
		return "", err == nil
	})
}

// UUID is a UUID flag that may be left empty (no tenant, no filter).
type UUID struct{ p *uuid.NullUUID }

// NewUUID returns a UUID that stores into p, which starts unset.
func NewUUID(p *uuid.NullUUID) *UUID {
	*p = uuid.NullUUID{}
	return &UUID{p: p}
}

func (v *UUID) Set(s string) error {
	if s == "" {
		*v.p = uuid.NullUUID{}
		return nil
	}
	id, err := uuid.Parse(s)
	if err != nil {
		return errors.New(v.Want())
	}
	*v.p = uuid.NullUUID{UUID: id, Valid: true}
	return nil
}

func (v *UUID) Want() string { return "want a UUID" }

func (v *UUID) String() string {
	if !v.p.Valid {
		return ""
	}
	return v.p.UUID.String()
}

func (v *UUID) Type() string { return "uuid" }
