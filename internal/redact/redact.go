// Package redact keeps secrets out of log lines: a slog.Handler that passes
// every message and attribute through a redacting function before the
// handler it wraps sees them. The function, which knows the secrets, belongs
// to the caller (the stream knows its password, the CLI every secret it was
// given).
package redact

import (
	"context"
	"log/slog"
)

// Handler wraps h so that the message and every string, error or other
// attribute (inside groups too) pass through redact first. With a nil
// redact it returns h.
func Handler(h slog.Handler, redact func(string) string) slog.Handler {
	if redact == nil {
		return h
	}
	return &handler{Handler: h, redact: redact}
}

type handler struct {
	slog.Handler
	redact func(string) string
}

func (h *handler) Handle(ctx context.Context, r slog.Record) error {
	nr := slog.NewRecord(r.Time, r.Level, h.redact(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		nr.AddAttrs(h.scrub(a))
		return true
	})
	return h.Handler.Handle(ctx, nr)
}

func (h *handler) scrub(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, h.redact(v.String()))
	case slog.KindGroup:
		g := v.Group()
		out := make([]any, len(g))
		for i, x := range g {
			out[i] = h.scrub(x)
		}
		return slog.Group(a.Key, out...)
	case slog.KindAny:
		if err, ok := v.Any().(error); ok {
			return slog.String(a.Key, h.redact(err.Error()))
		}
		return slog.String(a.Key, h.redact(v.String()))
	}
	return a
}

func (h *handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	out := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		out[i] = h.scrub(a)
	}
	return &handler{Handler: h.Handler.WithAttrs(out), redact: h.redact}
}

func (h *handler) WithGroup(name string) slog.Handler {
	return &handler{Handler: h.Handler.WithGroup(name), redact: h.redact}
}
