package declare

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/compensa/compensa/outbox"
)

// WalkInput is what `relay sagas test` gives a walk: a sample trigger and
// what steps would get back.
type WalkInput struct {
	// Trigger is the sample event: an object with the trigger's fields
	// (event_type, aggregate_id, payload, …); an object without "payload"
	// is taken as the payload itself.
	Trigger json.RawMessage
	// Replies, Responses and Rows give, per step name, the reply of a
	// command step, the response of an http step ({"status", "headers",
	// "body"}, or just the body with status 200) and the rows of a sql step.
	Replies   map[string]json.RawMessage
	Responses map[string]json.RawMessage
	Rows      map[string]json.RawMessage
	// Fail names the step that fails: the walk then shows the compensations
	// from the step before it down to the first.
	Fail string
}

// walkInstance is the instance id a walk shows.
const walkInstance = "00000000-0000-0000-0000-000000000000"

// Walk evaluates every expression of every step against the sample, without
// a database or network, and writes step by step what the saga would do:
// the SQL with its bound parameters, the HTTP request (secrets masked), the
// command and the rows it would emit. It stops at the first expression that
// fails, with its file:line:col.
func Walk(s *Saga, in WalkInput, w io.Writer) error {
	trig, err := walkTrigger(in.Trigger)
	if err != nil {
		return err
	}
	if in.Fail != "" && !s.hasStep(in.Fail) {
		return fmt.Errorf("--fail %s: the saga has no such step; use one of: %s", in.Fail, strings.Join(s.stepNames(), ", "))
	}
	for _, m := range []map[string]json.RawMessage{in.Replies, in.Responses, in.Rows} {
		for name := range m {
			if !s.hasStep(name) {
				return fmt.Errorf("%s: the saga has no such step; use one of: %s", name, strings.Join(s.stepNames(), ", "))
			}
		}
	}
	st := state{Trigger: trig, Steps: map[string]any{}}
	base := func() map[string]any {
		return map[string]any{
			varTrigger: st.Trigger,
			varSaga:    map[string]any{"id": walkInstance, "name": s.Name, "version": int64(s.Version)},
			varSteps:   st.Steps,
		}
	}
	fmt.Fprintf(w, "%s v%d (%s), trigger %v\n", s.Name, s.Version, s.File, trig["event_type"])
	failed := -1
	for i, step := range s.Steps {
		fmt.Fprintf(w, "\n%d. %s (%s)\n", i+1, step.Name, step.Kind())
		vars := base()
		if err := walkAction(w, &step.Action, step.Name, false, vars, in); err != nil {
			return err
		}
		if step.Name == in.Fail {
			fmt.Fprintf(w, "   FAILS (--fail %s): the saga compensates the steps before it, newest first\n", step.Name)
			failed = i
			break
		}
		if err := walkEmit(w, step.Action.Emit, vars); err != nil {
			return err
		}
		if step.Output != nil {
			v, err := step.Output.eval(vars)
			if err != nil {
				return err
			}
			st.Steps[step.Name] = v
			fmt.Fprintf(w, "   output: %s\n", jsonText(v))
		}
	}
	if failed < 0 {
		fmt.Fprintf(w, "\nCOMPLETED\n")
		return nil
	}
	for i := failed - 1; i >= 0; i-- {
		step := s.Steps[i]
		if step.Compensate == nil {
			fmt.Fprintf(w, "\ncompensate %d. %s: nothing to undo (no compensate)\n", i+1, step.Name)
			continue
		}
		fmt.Fprintf(w, "\ncompensate %d. %s (%s)\n", i+1, step.Name, step.Compensate.Kind())
		vars := base()
		vars[varStep] = stepVars("<instance id>", step.Name)
		if err := walkAction(w, step.Compensate, step.Name, true, vars, WalkInput{}); err != nil {
			return err
		}
		if err := walkEmit(w, step.Compensate.Emit, vars); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "\nCOMPENSATED\n")
	return nil
}

func (s *Saga) hasStep(name string) bool {
	for _, st := range s.Steps {
		if st.Name == name {
			return true
		}
	}
	return false
}

func (s *Saga) stepNames() []string {
	var out []string
	for _, st := range s.Steps {
		out = append(out, st.Name)
	}
	return out
}

func walkTrigger(raw json.RawMessage) (map[string]any, error) {
	var v any
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		return nil, fmt.Errorf("--trigger: not JSON: %v; give a JSON object such as {\"event_type\": \"order.placed\", \"payload\": {…}}", err)
	}
	m, ok := plain(v).(map[string]any)
	if !ok {
		return nil, fmt.Errorf("--trigger: not a JSON object; give {\"event_type\": …, \"payload\": {…}}")
	}
	if _, has := m["payload"]; !has {
		m = map[string]any{"payload": m}
	}
	trig := map[string]any{
		"id": "00000000-0000-0000-0000-000000000001", "event_type": "", "aggregate_type": "", "aggregate_id": "",
		"tenant_id": outbox.NilTenant.String(), "correlation_id": nil, "payload": nil, "headers": map[string]any{},
	}
	for k, v := range m {
		if _, known := trig[k]; !known {
			return nil, fmt.Errorf("--trigger: unknown field %q; a trigger has id, event_type, aggregate_type, aggregate_id, tenant_id, correlation_id, payload, headers", k)
		}
		trig[k] = v
	}
	return trig, nil
}

// jsonText is v as compact JSON for a person to read (no \u003c for <).
func jsonText(v any) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return fmt.Sprint(v)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

func decodeSample(what string, raw json.RawMessage) (any, error) {
	var v any
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		return nil, fmt.Errorf("%s: not JSON: %v", what, err)
	}
	return plain(v), nil
}

func walkAction(w io.Writer, a *Action, step string, comp bool, vars map[string]any, in WalkInput) error {
	switch {
	case a.SQL != nil:
		fmt.Fprintf(w, "   sql: %s\n", strings.Join(strings.Fields(a.SQL.Query), " "))
		for i, p := range a.SQL.Params {
			v, err := p.eval(vars)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "   $%d = %s\n", i+1, jsonText(bindParam(v)))
		}
		rows := []any{}
		if raw, ok := in.Rows[step]; ok {
			v, err := decodeSample("--rows "+step, raw)
			if err != nil {
				return err
			}
			l, ok := v.([]any)
			if !ok {
				return fmt.Errorf("--rows %s: give a JSON list of row objects, e.g. [{\"sku\": \"apple\"}]", step)
			}
			rows = l
		}
		vars[varResult] = map[string]any{"rows": rows, "rows_affected": int64(len(rows))}
		if !comp {
			fmt.Fprintf(w, "   result: %d row(s) %s (expect %s)\n", len(rows), jsonText(rows), a.SQL.Expect)
		}
	case a.HTTP != nil:
		secrets := map[string]any{}
		for _, n := range a.HTTP.secretNames() {
			secrets[n] = "<secret " + n + ">"
		}
		hv := make(map[string]any, len(vars)+1)
		for k, v := range vars {
			hv[k] = v
		}
		hv[varSecrets] = secrets
		url, err := a.HTTP.URL.evalText(hv)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "   %s %s\n", a.HTTP.Method, url)
		for _, h := range a.HTTP.Headers {
			v, err := h.value.evalText(hv)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "   %s: %s\n", h.name, v)
		}
		key := "<instance id>:" + step
		if comp {
			key += ":compensate"
		}
		fmt.Fprintf(w, "   Idempotency-Key: %s\n", key)
		if a.HTTP.Body != nil {
			v, err := a.HTTP.Body.eval(vars)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "   body: %s\n", jsonText(v))
		}
		resp := map[string]any{"status": int64(200), "headers": map[string]any{}, "body": map[string]any{}}
		if raw, ok := in.Responses[step]; ok {
			v, err := decodeSample("--response "+step, raw)
			if err != nil {
				return err
			}
			m, isMap := v.(map[string]any)
			_, hasStatus := m["status"]
			_, hasBody := m["body"]
			if isMap && (hasStatus || hasBody) {
				for k, x := range m {
					resp[k] = x
				}
			} else {
				resp["body"] = v
			}
		}
		vars[varResponse] = resp
		if !comp {
			fmt.Fprintf(w, "   response: %s\n", jsonText(resp))
		}
	case a.Command != nil:
		msg, err := walkMessage(&a.Command.Message, vars)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "   command: %s (its id is the step's command id), then waits up to %s for the reply\n", msg, a.Command.ReplyTimeout)
		var reply any = map[string]any{"ok": true}
		if raw, ok := in.Replies[step]; ok {
			v, err := decodeSample("--reply "+step, raw)
			if err != nil {
				return err
			}
			reply = v
		}
		vars[varReply] = reply
		fmt.Fprintf(w, "   reply: %s\n", jsonText(reply))
	}
	return nil
}

func walkEmit(w io.Writer, msgs []*Message, vars map[string]any) error {
	for _, m := range msgs {
		s, err := walkMessage(m, vars)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "   emit: %s\n", s)
	}
	return nil
}

func walkMessage(m *Message, vars map[string]any) (string, error) {
	c := &call{vars: vars}
	msg, err := c.message(m)
	if err != nil {
		return "", unwrapPermanent(err)
	}
	out := map[string]any{"event_type": msg.EventType, "payload": msg.Payload}
	if msg.AggregateType != "" {
		out["aggregate_type"] = msg.AggregateType
	}
	if msg.AggregateID != "" {
		out["aggregate_id"] = msg.AggregateID
	}
	if len(msg.Headers) > 0 {
		out["headers"] = msg.Headers
	}
	return jsonText(out), nil
}

// unwrapPermanent drops the runner's permanent marker: the walk prints the
// expression's own message.
func unwrapPermanent(err error) error {
	return fmt.Errorf("%s", err.Error())
}
