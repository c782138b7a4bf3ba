package redact

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
)

func TestHandlerScrubsMessagesAttributesGroupsAndErrors(t *testing.T) {
	var buf bytes.Buffer
	hide := func(s string) string { return strings.ReplaceAll(s, "hunter2", "xxxxx") }
	log := slog.New(Handler(slog.NewTextHandler(&buf, nil), hide)).With("dsn", "postgres://u:hunter2@h/db")
	log.WithGroup("g").Info("password hunter2 in the message",
		"err", errors.New("auth failed for hunter2"),
		slog.Group("inner", "s", "hunter2"),
		"any", []string{"hunter2"})
	out := buf.String()
	if strings.Contains(out, "hunter2") {
		t.Fatalf("a secret reached the log: %s", out)
	}
	if n := strings.Count(out, "xxxxx"); n != 5 {
		t.Fatalf("%d redactions, want 5 (message, dsn, err, inner.s, any): %s", n, out)
	}
}
