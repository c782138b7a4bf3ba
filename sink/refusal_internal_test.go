package sink

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
)

// Refusals are logged once per status, again when a status's reason
// changes, and the suppressed count is reported with the next line.
func TestRefusalsLoggedOncePerStatus(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	var r refusals
	refuse := func(code int, msg string) { r.note(log, EventError(WithStatus(code, errors.New(msg)))) }
	for range 50 {
		refuse(422, "POST http://h/x answered 422 Unprocessable Entity")
	}
	refuse(400, "POST http://h/x answered 400 Bad Request")
	refuse(422, "POST http://h/x answered 422 Unprocessable Entity")
	refuse(422, "POST http://h/y answered 422 Unprocessable Entity")
	r.note(log, EventError(errors.New("message of 2000000 bytes exceeds max_payload")))
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("%d lines, want 4 (422, 400, 422 with a new reason, a refusal without status):\n%s", len(lines), buf.String())
	}
	for i, want := range []string{"status=422", "status=400", "/y answered 422", "max_payload"} {
		if !strings.Contains(lines[i], "level=WARN") || !strings.Contains(lines[i], want) {
			t.Errorf("line %d: %s; want a WARN with %s", i, lines[i], want)
		}
	}
	if !strings.Contains(lines[2], "repeated=50") {
		t.Errorf("the line after a burst does not count the refusals it stood for: %s", lines[2])
	}
	if StatusOf(EventError(WithStatus(503, errors.New("x")))) != 503 || StatusOf(errors.New("x")) != 0 {
		t.Error("StatusOf does not find the status through EventError")
	}
}
