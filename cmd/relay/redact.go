package main

import (
	"context"
	"log/slog"

	"github.com/compensa/compensa/internal/dbconn"
)

func redactAll(s string, secrets []string) string { return dbconn.RedactAll(s, secrets) }

// redactingHandler scrubs secrets from every log message and string
// attribute, so that a DSN or an error that quotes one never leaks them.
type redactingHandler struct {
	slog.Handler
	secret []string
}

func (h *redactingHandler) Handle(ctx context.Context, r slog.Record) error {
	if len(h.secret) == 0 {
		return h.Handler.Handle(ctx, r)
	}
	nr := slog.NewRecord(r.Time, r.Level, redactAll(r.Message, h.secret), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		nr.AddAttrs(h.scrub(a))
		return true
	})
	return h.Handler.Handle(ctx, nr)
}

func (h *redactingHandler) scrub(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, redactAll(v.String(), h.secret))
	case slog.KindGroup:
		attrs := v.Group()
		out := make([]any, len(attrs))
		for i, g := range attrs {
			out[i] = h.scrub(g)
		}
		return slog.Group(a.Key, out...)
	case slog.KindAny:
		if err, ok := v.Any().(error); ok {
			return slog.String(a.Key, redactAll(err.Error(), h.secret))
		}
		return slog.String(a.Key, redactAll(v.String(), h.secret))
	}
	return a
}

func (h *redactingHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	scrubbed := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		scrubbed[i] = h.scrub(a)
	}
	return &redactingHandler{Handler: h.Handler.WithAttrs(scrubbed), secret: h.secret}
}

func (h *redactingHandler) WithGroup(name string) slog.Handler {
	return &redactingHandler{Handler: h.Handler.WithGroup(name), secret: h.secret}
}
