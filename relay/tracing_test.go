package relay_test

import (
	"context"
	"strings"
	"testing"

	"github.com/compensa/compensa/relay"
	"github.com/compensa/compensa/saga"
)

// TestBadTracingEnvFailsBeforeConnecting: an OTEL_* variable with a value
// the relay does not support stops New with the variable's name, before it
// tries the database. (Not parallel: it sets the environment.)
func TestBadTracingEnvFailsBeforeConnecting(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
	t.Setenv("OTEL_TRACES_SAMPLER", "sometimes")
	_, err := relay.New(context.Background(), relay.Config{DatabaseURL: "postgres://nobody@127.0.0.1:1/none", Registry: saga.NewRegistry()})
	if err == nil || !strings.Contains(err.Error(), "OTEL_TRACES_SAMPLER") {
		t.Fatalf("err = %v; want one naming OTEL_TRACES_SAMPLER", err)
	}
}
