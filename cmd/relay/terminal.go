package main

import (
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// Everything the CLI prints may hold text from the database: a step's
// error, a retry reason sent through the API, a saga name, an event's
// payload. A terminal obeys control characters in it: ESC and CSI
// sequences recolour or rewrite the screen, OSC 8 makes clickable links
// that say one thing and open another. So every byte the CLI writes to
// stdout goes through termWriter, and the one-line error on stderr
// through termSafe: control characters are shown as \u00XX escapes,
// invalid UTF-8 as \xNN; tab and newline, which the CLI's own layout uses,
// pass (the free-text fields fold them to spaces before printing).

// termWriter escapes control characters on their way to w. Every Write is
// escaped on its own: the CLI writes whole strings and tabwriter whole
// cells, so a character is never split between two writes.
type termWriter struct{ w io.Writer }

func newTermWriter(w io.Writer) io.Writer {
	if _, ok := w.(termWriter); ok {
		return w
	}
	return termWriter{w: w}
}

func (t termWriter) Write(p []byte) (int, error) {
	if clean(p) {
		return t.w.Write(p)
	}
	if _, err := io.WriteString(t.w, escapeTerm(string(p), "\t\n")); err != nil {
		return 0, err
	}
	return len(p), nil
}

// clean is the fast path: printable ASCII, tab and newline only.
func clean(p []byte) bool {
	for _, b := range p {
		if b >= 0x7f || b < 0x20 && b != '\t' && b != '\n' {
			return false
		}
	}
	return true
}

// termSafe escapes every control character of s, tab and newline included.
func termSafe(s string) string { return escapeTerm(s, "") }

// escapeTerm escapes C0 and C1 control characters and DEL, except those in
// keep, and invalid UTF-8 bytes. A \u00XX escape is valid inside a JSON
// string too, so --json output stays JSON.
func escapeTerm(s, keep string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case (r < 0x20 || r == 0x7f || r >= 0x80 && r <= 0x9f) && !strings.ContainsRune(keep, r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// plainReason refuses a --reason with control characters, as the API does:
// it is journaled and shown in other operators' terminals and pages.
func plainReason(reason string) error {
	if strings.ContainsFunc(reason, func(r rune) bool { return r < 0x20 || r == 0x7f || r >= 0x80 && r <= 0x9f }) {
		return fmt.Errorf("--reason holds control characters (escape sequences, newlines); give plain text on one line")
	}
	return nil
}
