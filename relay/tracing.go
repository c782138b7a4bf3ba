package relay

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/compensa/compensa/internal/tracing"
)

// openTracing picks the relay's TracerProvider: Config.TracerProvider, else
// one built from the OTEL_* environment variables, else none (off). With
// one, log lines written with a traced context carry trace_id and span_id.
func (r *Relay) openTracing(ctx context.Context) error {
	r.tracerProvider = r.cfg.TracerProvider
	if r.tracerProvider == nil {
		p, err := tracing.FromEnv(ctx)
		if err != nil {
			return fmt.Errorf("tracing: %w", err)
		}
		if p != nil {
			r.tracerProvider, r.ownTracer = p, p
		}
	}
	if tracing.Tracer(r.tracerProvider) == nil {
		r.tracerProvider = nil
		return nil
	}
	r.cfg.Logger = slog.New(tracing.LogHandler(r.cfg.Logger.Handler()))
	from := "relay.Config.TracerProvider"
	if r.ownTracer != nil {
		from = "OTEL_* environment"
	}
	r.cfg.Logger.Info("tracing on", "from", from)
	return nil
}

// closeTracing flushes the spans still buffered: it shuts down a provider
// the relay built from the environment, and flushes one passed in (its
// owner shuts it down).
func (r *Relay) closeTracing(ctx context.Context) {
	if r.ownTracer != nil {
		if err := r.ownTracer.Shutdown(ctx); err != nil {
			r.cfg.Logger.Warn("tracing: flushing spans on stop failed", "err", err)
		}
		r.ownTracer, r.tracerProvider = nil, nil
		return
	}
	if f, ok := r.tracerProvider.(interface{ ForceFlush(context.Context) error }); ok {
		if err := f.ForceFlush(ctx); err != nil {
			r.cfg.Logger.Warn("tracing: flushing spans on stop failed", "err", err)
		}
	}
}

// closeTracingSoon is closeTracing for an error path without a context.
func (r *Relay) closeTracingSoon() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r.closeTracing(ctx)
}

var _ trace.TracerProvider = (*tracing.Provider)(nil)
