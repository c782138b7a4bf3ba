package cliflag

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/compensa/compensa/internal/suggest"
)

// Enum is a flag that takes one word of a list, the list of the package
// that owns the words (saga.Statuses for a status).
type Enum struct {
	p        *string
	typ      string
	words    []string
	optional bool
}

// NewEnum returns an Enum that stores into p, which starts as def; typ
// names the value in --help ("status", "fair|oldest").
func NewEnum(p *string, def, typ string, words ...string) *Enum {
	*p = def
	return &Enum{p: p, typ: typ, words: words}
}

// Optional makes the empty word acceptable too: no choice, as when the flag
// is not given (a filter that is off).
func (e *Enum) Optional() *Enum {
	e.optional = true
	return e
}

// Set takes s when it is one of the words, exactly; otherwise the error
// lists them and proposes the nearest.
func (e *Enum) Set(s string) error {
	if slices.Contains(e.words, s) || (s == "" && e.optional) {
		*e.p = s
		return nil
	}
	want := e.Want()
	if near := suggest.Nearest(s, e.words); near != "" {
		want += fmt.Sprintf("; did you mean %q?", near)
	}
	return errors.New(want)
}

func (e *Enum) Want() string   { return "want one of " + strings.Join(e.words, ", ") }
func (e *Enum) String() string { return *e.p }
func (e *Enum) Type() string   { return e.typ }

// Words are the words the flag takes.
func (e *Enum) Words() []string { return slices.Clone(e.words) }
