package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/compensa/compensa/relay"
	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/sink/dial"
)

// newSinksTestCmd is `relay sinks test FILE --event JSON`: what each sink
// would deliver for one event, with no broker, endpoint or database.
func newSinksTestCmd(opts *rootOptions) *cobra.Command {
	var eventJSON string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "test FILE --event JSON",
		Short: "Show what each sink of a file would deliver for one event (destination, headers, body) or why not; no broker or database",
		Long: `Show what each sink of a sinks file would deliver for one event: the
destination (webhook URL, NATS subject, Kafka topic), the headers and the body,
encoded exactly as the relay does (format, filter, transform, templates) - or
why not: its match does not select the event, its filter rejects it, or an
expression fails (the relay would park the event with that reason).

The event is JSON with the envelope's fields: id, tenant_id, aggregate_type,
aggregate_id, event_type, payload, headers, correlation_id, causation_id,
created_at; --event @FILE reads it from a file. Nothing connects: the default
CloudEvents source names the database of --database-url (never contacted) and
--outbox-table. A webhook is signed when its secret_env is set.`,
		Example: `  relay sinks test sinks.yaml --event '{"event_type":"order.placed","aggregate_type":"order","aggregate_id":"o-1","payload":{"amount":120}}'`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := sink.LoadFile(args[0])
			var ce *sink.ConfigError
			if errors.As(err, &ce) {
				for _, p := range ce.Problems {
					fmt.Fprintln(cmd.ErrOrStderr(), terminalSafe(p.String()))
				}
				return exitError{code: 2, msg: fmt.Sprintf("%s: %d problems; fix them (relay sinks validate) and test again", args[0], len(ce.Problems))}
			}
			if err != nil {
				return exitError{code: 2, msg: err.Error()}
			}
			ev, err := readTestEvent(eventJSON)
			if err != nil {
				return exitError{code: 2, msg: err.Error()}
			}
			cfg.SetDefaultSource(relay.SinkSource(opts.DatabaseURL, opts.OutboxTable))
			previews := dial.PreviewAll(cfg, ev, nil)
			out := cmd.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(map[string]any{"sinks": previews})
			}
			for i, p := range previews {
				if i > 0 {
					fmt.Fprintln(out)
				}
				fmt.Fprintf(out, "sink %s (%s): %s\n", p.Sink, p.Kind, p.Outcome)
				if p.Reason != "" {
					fmt.Fprintf(out, "  %s\n", terminalSafe(p.Reason))
				}
				if p.Outcome != dial.OutcomeDeliver {
					continue
				}
				fmt.Fprintf(out, "  to %s\n", terminalSafe(p.Destination))
				if p.Key != "" {
					fmt.Fprintf(out, "  key %s\n", terminalSafe(p.Key))
				}
				for _, h := range p.Headers {
					fmt.Fprintf(out, "  %s: %s\n", terminalSafe(h.Name), terminalSafe(h.Value))
				}
				if p.BodyBase64 != "" {
					fmt.Fprintf(out, "  body (base64, not UTF-8):\n  %s\n", p.BodyBase64)
				} else {
					fmt.Fprintf(out, "  body:\n  %s\n", terminalSafe(p.Body))
				}
				if p.Note != "" {
					fmt.Fprintf(out, "  note: %s\n", terminalSafe(p.Note))
				}
			}
			return nil
		},
	}
	opts.bindTo(cmd.Flags(), "database-url", "outbox-table")
	cmd.Flags().StringVar(&eventJSON, "event", "", "the event as JSON, or @FILE (required)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// readTestEvent reads --event: JSON with the envelope's fields. A missing
// id gets a fixed one, so that the output is the same on every run.
func readTestEvent(s string) (*sink.Event, error) {
	if s == "" {
		return nil, errors.New("--event is required: the event as JSON, e.g. --event '{\"event_type\":\"order.placed\",\"payload\":{}}'")
	}
	data := []byte(s)
	if name, ok := strings.CutPrefix(s, "@"); ok {
		b, err := os.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("--event: %w", err)
		}
		data = b
	}
	var ev sink.Event
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ev); err != nil {
		return nil, fmt.Errorf("--event is not an event: %v; write JSON with id, tenant_id, aggregate_type, aggregate_id, event_type, payload, headers, correlation_id, causation_id, created_at", err)
	}
	if ev.ID == "" {
		ev.ID = "00000000-0000-0000-0000-000000000000"
	}
	if len(ev.Payload) == 0 {
		ev.Payload = json.RawMessage("null")
	}
	return &ev, nil
}
