package declare

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/saga"
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
	// Fail names the step that fails for good (without acting): the walk
	// then shows the compensations from the step before it down to the
	// first.
	Fail string
}

// Walk outcomes, as the runner would end the instance (or the correlator
// treat the trigger).
const (
	WalkCompleted   = "COMPLETED"
	WalkCompensated = "COMPENSATED"
	WalkFailed      = "FAILED"
	// WalkFiltered: a trigger's filter said no; nothing starts.
	WalkFiltered = "FILTERED"
	// WalkDeadLetter: the event does not fit (its schema, a failing
	// filter); it is parked and nothing starts.
	WalkDeadLetter = "DEAD_LETTER"
)

// WalkResult is what the walk saw the saga do.
type WalkResult struct {
	Status string `json:"status"`
	// Steps are the steps that ran, in order (a skipped-for-failure one
	// is not among them; the failing step is).
	Steps []string `json:"steps"`
	// Compensations are the compensations that ran, newest step first.
	Compensations []string `json:"compensations"`
	// Emitted are the event types of the rows the saga wrote (emits and
	// commands), in order.
	Emitted []string `json:"emitted"`
	// Reason says why the saga did not complete.
	Reason string `json:"reason,omitempty"`
}

// walkInstance is the instance id a walk shows.
const walkInstance = "00000000-0000-0000-0000-000000000000"

// stepFailure is how one step of a walk failed: acted reports that its
// effect may exist (the runner compensates it too).
type stepFailure struct {
	err   error
	acted bool
}

// Walk evaluates the saga against the sample as the runner would run it,
// without a database or network, and writes step by step what it would
// do: the SQL with its bound parameters, the HTTP request (secrets masked),
// the command and the rows it would emit. A step fails as it would at run
// time: an expression that fails, a sql result that misses its expect, an
// http status that is not 2xx (408, 429 and 5xx count as "may have
// acted"), a reply that reports a failure, or --fail; the compensations
// then run newest first. It returns the outcome; an error only for an
// input it cannot use (a step name that does not exist, a sample that is
// not JSON).
func Walk(s *Saga, in WalkInput, w io.Writer) (WalkResult, error) {
	res := WalkResult{Steps: []string{}, Compensations: []string{}, Emitted: []string{}}
	trig, err := walkTrigger(in.Trigger)
	if err != nil {
		return res, err
	}
	if in.Fail != "" && !s.hasStep(in.Fail) {
		return res, fmt.Errorf("--fail %s: the saga has no such step; use one of: %s", in.Fail, strings.Join(s.stepNames(), ", "))
	}
	for _, m := range []map[string]json.RawMessage{in.Replies, in.Responses, in.Rows} {
		for name := range m {
			if !s.hasStep(name) {
				return res, fmt.Errorf("%s: the saga has no such step; use one of: %s", name, strings.Join(s.stepNames(), ", "))
			}
		}
	}
	fmt.Fprintf(w, "%s v%d (%s), trigger %v\n", s.Name, s.Version, s.File, trig["event_type"])
	if status, reason := walkContracts(s, trig); status != "" {
		res.Status, res.Reason = status, reason
		fmt.Fprintf(w, "\n%s: %s\n", status, reason)
		return res, nil
	}
	if c := s.Concurrency; c != nil {
		key, err := c.Key.evalText(map[string]any{varTrigger: trig, varSaga: map[string]any{"name": s.Name, "version": int64(s.Version)}, varSteps: map[string]any{}})
		if err != nil {
			res.Status, res.Reason = WalkDeadLetter, fmt.Sprintf("the concurrency key of saga %s: %v", s.Name, err)
			fmt.Fprintf(w, "\n%s: %s\n", res.Status, res.Reason)
			return res, nil
		}
		fmt.Fprintf(w, "concurrency key %q: runs once fewer than %d older instances of it are unfinished\n", key, c.Limit)
	}
	st := state{Trigger: trig, Steps: map[string]any{}}
	base := func() map[string]any {
		return map[string]any{
			varTrigger: st.Trigger,
			varSaga:    map[string]any{"id": walkInstance, "name": s.Name, "version": int64(s.Version)},
			varSteps:   st.Steps,
		}
	}
	failed, from := -1, -1 // the failing step; the newest step to compensate
	skipped := map[int]bool{}
	for i, step := range s.Steps {
		fmt.Fprintf(w, "\n%d. %s (%s)\n", i+1, step.Name, step.Kind())
		if step.Rate != nil {
			scope := "shared by every tenant"
			if step.Rate.PerTenant {
				scope = "per tenant"
			}
			fmt.Fprintf(w, "   rate: starts at most one every %s across relays, %s\n", step.Rate.Every(), scope)
		}
		vars := base()
		var f *stepFailure
		if step.When != nil {
			run, err := (&call{vars: vars}).when(step)
			switch {
			case err != nil:
				f = &stepFailure{err: unwrapPermanent(err)}
			case !run:
				skipped[i] = true
				fmt.Fprintf(w, "   skipped (when is false)\n")
				continue
			}
		}
		res.Steps = append(res.Steps, step.Name)
		if f == nil && step.Wait != nil {
			f = walkWait(w, step.Wait, vars)
		} else if f == nil {
			var err error
			if f, err = walkStep(w, s, step, vars, in, &res); err != nil {
				return res, err
			}
		}
		if f == nil && step.Name == in.Fail {
			f = &stepFailure{err: fmt.Errorf("--fail %s", step.Name)}
		}
		if f != nil {
			failed, from = i, i-1
			if f.acted {
				from = i
				fmt.Fprintf(w, "   FAILS, may have acted: %v\n   the saga compensates this step and the ones before it, newest first\n", f.err)
			} else {
				fmt.Fprintf(w, "   FAILS: %v\n   the saga compensates the steps before it, newest first\n", f.err)
			}
			res.Reason = fmt.Sprintf("step %s failed: %v", step.Name, f.err)
			break
		}
	}
	if failed < 0 {
		res.Status = WalkCompleted
		fmt.Fprintf(w, "\n%s\n", WalkCompleted)
		return res, nil
	}
	for i := from; i >= 0; i-- {
		step := s.Steps[i]
		if skipped[i] {
			fmt.Fprintf(w, "\ncompensate %d. %s: nothing to undo (skipped)\n", i+1, step.Name)
			continue
		}
		if step.Compensate == nil {
			fmt.Fprintf(w, "\ncompensate %d. %s: nothing to undo (no compensate)\n", i+1, step.Name)
			continue
		}
		fmt.Fprintf(w, "\ncompensate %d. %s (%s)\n", i+1, step.Name, step.Compensate.Kind())
		res.Compensations = append(res.Compensations, step.Name)
		vars := base()
		vars[varStep] = stepVars("<instance id>", step.Name)
		err := func() error {
			if _, recorded := st.Steps[step.Name]; step.Compensate.readsOwnOutput && !recorded && step.Output != nil {
				return fmt.Errorf("it reads the step's output, which the step never recorded; write it by step.idempotency_key")
			}
			if err := walkAction(w, step.Compensate, step.Name, true, vars, WalkInput{}); err != nil {
				return err
			}
			return walkEmit(w, step.Compensate.Emit, vars, &res)
		}()
		if err != nil {
			var sample sampleError
			if errors.As(err, &sample) {
				return res, err
			}
			res.Status = WalkFailed
			res.Reason = fmt.Sprintf("the compensation of step %s failed: %v", step.Name, unwrapPermanent(err))
			fmt.Fprintf(w, "   FAILS: %v\n\n%s: the instance waits for a person (relay sagas retry)\n", unwrapPermanent(err), WalkFailed)
			return res, nil
		}
	}
	res.Status = WalkCompensated
	fmt.Fprintf(w, "\n%s\n", WalkCompensated)
	return res, nil
}

// walkContracts applies the trigger's schema and filter as the correlator
// would: "" when the saga starts.
func walkContracts(s *Saga, trig map[string]any) (status, reason string) {
	for i, t := range s.Triggers {
		if t.EventType != trig["event_type"] && trig["event_type"] != "" {
			continue
		}
		if t.AggregateType != "" && t.AggregateType != trig["aggregate_type"] {
			continue
		}
		var c *triggerContract
		if i < len(s.contracts) {
			c = s.contracts[i]
		}
		f := c.filterFunc(s)
		if f == nil {
			return "", ""
		}
		ev, err := walkEvent(trig)
		if err != nil {
			return WalkDeadLetter, err.Error()
		}
		ok, err := f(ev)
		if err != nil {
			return WalkDeadLetter, fmt.Sprintf("saga %s: %v", s.Name, err)
		}
		if !ok {
			return WalkFiltered, "the trigger's filter said no: nothing starts (compensa_events_total{outcome=\"filtered\"})"
		}
		return "", ""
	}
	return "", ""
}

// walkEvent is the sample trigger as the outbox event the correlator sees.
func walkEvent(trig map[string]any) (outbox.Event, error) {
	payload, err := json.Marshal(trig["payload"])
	if err != nil {
		return outbox.Event{}, err
	}
	headers, _ := json.Marshal(trig["headers"])
	text := func(k string) string { s, _ := trig[k].(string); return s }
	ev := outbox.Event{EventType: text("event_type"), AggregateType: text("aggregate_type"), AggregateID: text("aggregate_id"),
		Payload: payload, Headers: headers, RawID: text("id")}
	if id, err := uuid.Parse(text("id")); err == nil {
		ev.ID = id
	}
	if id, err := uuid.Parse(text("tenant_id")); err == nil {
		ev.TenantID = id
	}
	return ev, nil
}

// walkStep runs one step of the walk: its action, its emits and its
// output. A failure of the step is returned as a stepFailure; an error is a
// sample the walk cannot use.
func walkStep(w io.Writer, s *Saga, step *Step, vars map[string]any, in WalkInput, res *WalkResult) (*stepFailure, error) {
	var sample sampleError
	err := walkAction(w, &step.Action, step.Name, false, vars, in)
	if errors.As(err, &sample) {
		return nil, err
	}
	cmd := step.Action.Command
	if cmd != nil && (err == nil || errors.Is(err, saga.ErrMayHaveActed)) {
		res.Emitted = append(res.Emitted, cmd.EventType) // the command was sent
	}
	if err != nil {
		return &stepFailure{err: unwrapPermanent(err), acted: errors.Is(err, saga.ErrMayHaveActed)}, nil
	}
	err = walkEmit(w, step.Action.Emit, vars, res)
	if err == nil && step.Output != nil {
		var v any
		if v, err = step.Output.eval(vars); err == nil {
			st := vars[varSteps].(map[string]any)
			st[step.Name] = v
			fmt.Fprintf(w, "   output: %s\n", jsonText(v))
		}
	}
	if err == nil {
		return nil, nil
	}
	if errors.As(err, &sample) {
		return nil, err
	}
	// A command step that fails after its reply has acted: the command
	// was committed.
	return &stepFailure{err: unwrapPermanent(err), acted: cmd != nil}, nil
}

// sampleError is a sample the walk cannot use (not a failure of the saga).
type sampleError struct{ error }

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
		return nil, sampleError{fmt.Errorf("%s: not JSON: %v", what, err)}
	}
	return plain(v), nil
}

// walkAction shows one action and gives the step's failure as the runner
// would classify it (saga.Permanent, saga.MayHaveActed), or a sampleError.
func walkAction(w io.Writer, a *Action, step string, comp bool, vars map[string]any, in WalkInput) error {
	switch {
	case a.SQL != nil:
		fmt.Fprintf(w, "   sql: %s\n", strings.Join(strings.Fields(a.SQL.Query), " "))
		for i, p := range a.SQL.Params {
			v, err := p.eval(vars)
			if err != nil {
				return evalErr(err)
			}
			fmt.Fprintf(w, "   $%d = %s\n", i+1, jsonText(bindParam(v)))
		}
		rows := []any{}
		var affected int64
		if raw, ok := in.Rows[step]; ok {
			v, err := decodeSample("--rows "+step, raw)
			if err != nil {
				return err
			}
			switch l := v.(type) {
			case []any:
				rows, affected = l, int64(len(l))
			case int64: // rows affected by a statement without RETURNING
				affected = l
			default:
				return sampleError{fmt.Errorf("--rows %s: give a JSON list of row objects, e.g. [{\"sku\": \"apple\"}], or the number of rows a statement without RETURNING affects", step)}
			}
		}
		vars[varResult] = map[string]any{"rows": rows, "rows_affected": affected}
		// As at run time: the rows returned, else the rows affected.
		got := int64(len(rows))
		if got == 0 {
			got = affected
		}
		if !comp {
			if len(rows) == 0 && affected > 0 {
				fmt.Fprintf(w, "   result: %d row(s) affected (expect %s)\n", affected, cmpOr(a.SQL.Expect, "any"))
			} else {
				fmt.Fprintf(w, "   result: %d row(s) %s (expect %s)\n", got, jsonText(rows), cmpOr(a.SQL.Expect, "any"))
			}
		}
		switch a.SQL.Expect {
		case "one_row":
			if got != 1 {
				return saga.Permanent(fmt.Errorf("sql expected one row, got %d", got))
			}
		case "some_rows":
			if got == 0 {
				return saga.Permanent(errors.New("sql expected some rows, got none"))
			}
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
		url, err := a.HTTP.URL.evalURL(hv)
		if err != nil {
			return evalErr(err)
		}
		fmt.Fprintf(w, "   %s %s\n", a.HTTP.Method, url)
		for _, h := range a.HTTP.Headers {
			v, err := h.value.evalText(hv)
			if err != nil {
				return evalErr(err)
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
				return evalErr(err)
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
		status, ok := resp["status"].(int64)
		if !ok || status < 100 || status > 599 {
			return sampleError{fmt.Errorf("--response %s: status must be an HTTP status code (100 to 599), got %s", step, jsonText(resp["status"]))}
		}
		vars[varResponse] = resp
		if !comp {
			fmt.Fprintf(w, "   response: %s\n", jsonText(resp))
		}
		switch {
		case status >= 200 && status < 300:
		case status == http.StatusRequestTimeout || status == http.StatusTooManyRequests || status >= 500:
			return saga.MayHaveActed(fmt.Errorf("http %s answered %d, and every retry alike", a.HTTP.Method, status))
		default:
			return saga.Permanent(fmt.Errorf("http %s answered %d %s", a.HTTP.Method, status, jsonText(resp["body"])))
		}
	case a.Command != nil:
		msg, err := walkMessage(&a.Command.Message, vars)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "   command: %s (its id is the step's command id), then waits up to %s for the reply%s\n", msg, a.Command.ReplyTimeout, onTimeoutText(a.Command.OnTimeout))
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
		b, _ := json.Marshal(reply)
		if r := saga.ParseReply(b); !r.OK {
			return saga.MayHaveActed(fmt.Errorf("the reply reports a failure: %s", r.Error))
		}
	}
	return nil
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func walkEmit(w io.Writer, msgs []*Message, vars map[string]any, res *WalkResult) error {
	for _, m := range msgs {
		s, err := walkMessage(m, vars)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "   emit: %s\n", s)
		res.Emitted = append(res.Emitted, m.EventType)
	}
	return nil
}

func walkMessage(m *Message, vars map[string]any) (string, error) {
	c := &call{vars: vars}
	msg, err := c.message(m)
	if err != nil {
		return "", err
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

// unwrapPermanent drops the runner's markers: the walk prints the
// failure's own message.
func unwrapPermanent(err error) error {
	return fmt.Errorf("%s", err.Error())
}

// walkWait shows a wait step: the saga goes on after it.
func walkWait(w io.Writer, wa *WaitAction, vars map[string]any) *stepFailure {
	if wa.Until == nil {
		fmt.Fprintf(w, "   waits %s (no worker held), then goes on\n", shortDuration(wa.Duration))
		return nil
	}
	until, err := (&call{vars: vars}).waitUntil(wa, time.Now())
	if err != nil {
		return &stepFailure{err: unwrapPermanent(err)}
	}
	fmt.Fprintf(w, "   waits until %s (no worker held), then goes on\n", until.UTC().Format(time.RFC3339))
	return nil
}

// shortDuration writes d as written in a file: 2h, not 2h0m0s.
func shortDuration(d time.Duration) string {
	t := d.String()
	if strings.HasSuffix(t, "m0s") {
		t = strings.TrimSuffix(t, "0s")
	}
	if strings.HasSuffix(t, "h0m") {
		t = strings.TrimSuffix(t, "0m")
	}
	return t
}

func onTimeoutText(on string) string {
	switch on {
	case "compensate":
		return " (none in time: compensate at once)"
	case "fail":
		return " (none in time: the instance ends FAILED, not compensated)"
	}
	return ""
}
