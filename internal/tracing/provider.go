package tracing

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
)

// DefaultServiceName is service.name when OTEL_SERVICE_NAME (or
// service.name in OTEL_RESOURCE_ATTRIBUTES) does not say otherwise.
const DefaultServiceName = "compensa-relay"

// Provider is a TracerProvider built from the environment, with the
// Shutdown that flushes it.
type Provider struct {
	*sdktrace.TracerProvider
}

// FromEnv builds a TracerProvider from the standard OpenTelemetry
// variables, or returns nil (tracing off) when they do not ask for traces:
//
//	OTEL_SDK_DISABLED=true           off
//	OTEL_TRACES_EXPORTER             otlp (the default once an endpoint is set) or none
//	OTEL_EXPORTER_OTLP_ENDPOINT      (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) turns traces on
//	OTEL_EXPORTER_OTLP_PROTOCOL      http/protobuf (default) or grpc (also _TRACES_PROTOCOL)
//	OTEL_SERVICE_NAME                default compensa-relay
//	OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG
//
// The exporters read the other OTEL_EXPORTER_OTLP_* variables (headers,
// timeout, TLS) themselves.
func FromEnv(ctx context.Context) (*Provider, error) {
	return fromLookup(ctx, os.LookupEnv)
}

// CheckEnv reports an OTEL_* variable set to a value FromEnv would refuse,
// without building anything: a relay checks it before it connects.
func CheckEnv() error {
	_, err := settingsFrom(os.LookupEnv)
	return err
}

// settings are what the OTEL_* variables ask for; nil when no traces.
type settings struct {
	proto   string
	sampler sdktrace.Sampler
}

func settingsFrom(env func(string) (string, bool)) (*settings, error) {
	get := func(k string) string { v, _ := env(k); return strings.TrimSpace(v) }
	if strings.EqualFold(get("OTEL_SDK_DISABLED"), "true") {
		return nil, nil
	}
	endpoint := get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" || get("OTEL_EXPORTER_OTLP_ENDPOINT") != ""
	switch exp := strings.ToLower(get("OTEL_TRACES_EXPORTER")); exp {
	case "":
		if !endpoint {
			return nil, nil // nothing asked for traces: off
		}
	case "none":
		return nil, nil
	case "otlp":
	default:
		return nil, fmt.Errorf("OTEL_TRACES_EXPORTER=%q is not supported: use otlp (with OTEL_EXPORTER_OTLP_ENDPOINT) or none", exp)
	}
	sampler, err := samplerFrom(get("OTEL_TRACES_SAMPLER"), get("OTEL_TRACES_SAMPLER_ARG"))
	if err != nil {
		return nil, err
	}
	proto := strings.ToLower(get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"))
	if proto == "" {
		proto = strings.ToLower(get("OTEL_EXPORTER_OTLP_PROTOCOL"))
	}
	switch proto {
	case "", "http/protobuf", "grpc":
	default:
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%q is not supported: use http/protobuf (the default) or grpc", proto)
	}
	return &settings{proto: proto, sampler: sampler}, nil
}

func fromLookup(ctx context.Context, env func(string) (string, bool)) (*Provider, error) {
	st, err := settingsFrom(env)
	if st == nil || err != nil {
		return nil, err
	}
	sampler, proto := st.sampler, st.proto
	var exporter sdktrace.SpanExporter
	switch proto {
	case "", "http/protobuf":
		exporter, err = otlptracehttp.New(ctx)
	case "grpc":
		exporter, err = otlptracegrpc.New(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(DefaultServiceName)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv()) // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
	if err != nil && res == nil {
		return nil, fmt.Errorf("tracing: resource from OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	return &Provider{sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exporter),
		sdktrace.WithSampler(sampler),
		sdktrace.WithResource(res),
	)}, nil
}

// samplerFrom is OTEL_TRACES_SAMPLER (default parentbased_always_on) with
// its argument, checked so that a typo is an error rather than a silent
// default.
func samplerFrom(name, arg string) (sdktrace.Sampler, error) {
	ratio := func() (float64, error) {
		if arg == "" {
			return 1, nil
		}
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || r < 0 || r > 1 {
			return 0, fmt.Errorf("OTEL_TRACES_SAMPLER_ARG=%q: want a ratio between 0 and 1 (e.g. 0.1)", arg)
		}
		return r, nil
	}
	switch strings.ToLower(name) {
	case "", "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "traceidratio":
		r, err := ratio()
		if err != nil {
			return nil, err
		}
		return sdktrace.TraceIDRatioBased(r), nil
	case "parentbased_traceidratio":
		r, err := ratio()
		if err != nil {
			return nil, err
		}
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(r)), nil
	}
	return nil, errors.New("OTEL_TRACES_SAMPLER=" + strconv.Quote(name) + " is not supported: use always_on, always_off, traceidratio, parentbased_always_on (the default), parentbased_always_off or parentbased_traceidratio")
}
