package declare

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	neturl "net/url"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/compensa/compensa/internal/tracing"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/saga"
)

// Runtime is what declared steps need from the process that runs them.
type Runtime struct {
	// HTTP, when its Transport is set, carries the calls of http steps to
	// hosts written literally in the file; nil is a transport like
	// http.DefaultTransport. Calls whose host comes from an expression
	// always go through the relay's own checked transport, and no call
	// follows a redirect (unless the action says follow_redirects:
	// same_origin), whatever this client says. The step's timeout bounds
	// each call.
	HTTP *http.Client
	// EgressAllow is the operator's allow list (--http-egress-allow): host
	// names, IP addresses and CIDR networks that an http step whose host
	// comes from an expression may reach, beside the file's egress.allow.
	// Validate it with ValidateEgressAllow.
	EgressAllow []string
	// LookupEnv reads secrets (RELAY_SECRET_<NAME>); nil is os.LookupEnv.
	LookupEnv func(string) (string, bool)
	// Logger; nil discards.
	Logger *slog.Logger
}

func (rt *Runtime) logger() *slog.Logger {
	if rt != nil && rt.Logger != nil {
		return rt.Logger
	}
	return slog.New(slog.DiscardHandler)
}

func (rt *Runtime) secret(name string) (string, bool) {
	lookup := os.LookupEnv
	if rt != nil && rt.LookupEnv != nil {
		lookup = rt.LookupEnv
	}
	return lookup(SecretEnvPrefix + name)
}

// maxBody caps what an http step reads of a response.
const maxBody = 1 << 20

// state is a declared saga's instance state: the trigger event and the
// outputs of the steps done so far.
type state struct {
	Trigger map[string]any `json:"trigger"`
	Steps   map[string]any `json:"steps"`
}

// StartState builds the initial state from a trigger event.
func StartState(ev outbox.Event) (json.RawMessage, error) {
	var payload any
	if len(bytes.TrimSpace(ev.Payload)) > 0 {
		if err := json.Unmarshal(ev.Payload, &payload); err != nil {
			return nil, fmt.Errorf("payload is not JSON: %v", err)
		}
	}
	headers := map[string]any{}
	if len(bytes.TrimSpace(ev.Headers)) > 0 {
		var h any
		if json.Unmarshal(ev.Headers, &h) == nil {
			if m, ok := h.(map[string]any); ok {
				headers = m
			}
		}
	}
	var corr any
	if ev.CorrelationID.Valid {
		corr = ev.CorrelationID.UUID.String()
	}
	id := ev.RawID
	if id == "" {
		id = ev.ID.String()
	}
	trig := map[string]any{
		"id": id, "event_type": ev.EventType, "aggregate_type": ev.AggregateType,
		"aggregate_id": ev.AggregateID, "tenant_id": ev.TenantID.String(),
		"correlation_id": corr, "payload": payload, "headers": headers,
	}
	return json.Marshal(state{Trigger: trig, Steps: map[string]any{}})
}

func decodeState(raw json.RawMessage) (state, error) {
	var st state
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v map[string]any
	if err := d.Decode(&v); err != nil {
		return st, saga.Permanent(fmt.Errorf("the instance state is not a declared saga's state: %v", err))
	}
	conv, _ := plain(v).(map[string]any)
	st.Trigger, _ = conv["trigger"].(map[string]any)
	st.Steps, _ = conv["steps"].(map[string]any)
	if st.Trigger == nil {
		return st, saga.Permanent(errors.New("the instance state has no trigger: it was not started as a declared saga"))
	}
	if st.Steps == nil {
		st.Steps = map[string]any{}
	}
	return st, nil
}

// Definition turns the loaded saga into the runner's saga.Definition.
func (s *Saga) Definition(rt *Runtime) saga.Definition {
	d := saga.Definition{
		Name: s.Name, Version: s.Version, Triggers: s.Triggers, Deadline: s.Deadline,
		StartState: StartState,
	}
	if len(s.contracts) == len(s.Triggers) {
		d.Triggers = make([]saga.Trigger, len(s.Triggers))
		for i, t := range s.Triggers {
			t.Filter = s.contracts[i].filterFunc(s)
			d.Triggers[i] = t
		}
	}
	eg := newEgress(s, rt)
	for _, st := range s.Steps {
		d.Steps = append(d.Steps, st.runnerStep(s, rt, eg))
	}
	if c := s.Concurrency; c != nil {
		d.Concurrency = &saga.Concurrency{Limit: c.Limit, Global: c.Global, Key: func(ev outbox.Event) (string, error) {
			raw, err := StartState(ev)
			if err != nil {
				return "", err
			}
			st, err := decodeState(raw)
			if err != nil {
				return "", err
			}
			return c.Key.evalText(map[string]any{
				varTrigger: st.Trigger,
				varSaga:    map[string]any{"name": s.Name, "version": int64(s.Version)},
				varSteps:   map[string]any{},
			})
		}}
	}
	return d
}

// call is one run of a step's function: the variables its expressions see.
type call struct {
	s    *Saga
	rt   *Runtime
	eg   *egress
	x    *saga.StepTx
	st   state
	vars map[string]any
}

func newCall(s *Saga, rt *Runtime, eg *egress, x *saga.StepTx) (*call, error) {
	st, err := decodeState(x.State)
	if err != nil {
		return nil, err
	}
	c := &call{s: s, rt: rt, eg: eg, x: x, st: st}
	c.vars = map[string]any{
		varTrigger: st.Trigger,
		varSaga:    map[string]any{"id": x.Instance.ID.String(), "name": s.Name, "version": int64(s.Version)},
		varSteps:   st.Steps,
	}
	return c, nil
}

// evalErr makes an expression failure permanent: the same expression on
// the same values fails the same way on every attempt.
func evalErr(err error) error { return saga.Permanent(err) }

func (st *Step) runnerStep(s *Saga, rt *Runtime, eg *egress) saga.Step {
	out := saga.Step{
		Name: st.Name, Kind: st.Kind(), Timeout: st.Timeout, Retry: st.Retry, CompensationRetry: st.CompensationRetry,
		Rate: st.Rate,
	}
	a := st.Action
	if a.Command != nil {
		out.ReplyTimeout = a.Command.ReplyTimeout
		out.OnReplyTimeout = saga.ReplyTimeoutAction(a.Command.OnTimeout)
		out.Do = func(ctx context.Context, x *saga.StepTx) error {
			c, err := newCall(s, rt, eg, x)
			if err != nil {
				return err
			}
			msg, err := c.message(&a.Command.Message)
			if err != nil {
				return err
			}
			return x.EmitCommand(ctx, msg)
		}
		out.OnReply = func(ctx context.Context, x *saga.StepTx, reply saga.Reply) error {
			c, err := newCall(s, rt, eg, x)
			if err != nil {
				return err
			}
			var v any
			d := json.NewDecoder(bytes.NewReader(reply.Payload))
			d.UseNumber()
			if err := d.Decode(&v); err != nil {
				return saga.Permanent(fmt.Errorf("reply is not JSON: %v", err))
			}
			c.vars[varReply] = plain(v)
			return c.finish(ctx, st, &a)
		}
	} else {
		out.Do = func(ctx context.Context, x *saga.StepTx) error {
			c, err := newCall(s, rt, eg, x)
			if err != nil {
				return err
			}
			if err := c.act(ctx, &a, st, false); err != nil {
				return err
			}
			return c.finish(ctx, st, &a)
		}
	}
	if st.Wait != nil {
		out.Do = func(ctx context.Context, x *saga.StepTx) error {
			c, err := newCall(s, rt, eg, x)
			if err != nil {
				return err
			}
			return c.wait(st.Wait)
		}
	}
	if st.When != nil {
		do := out.Do
		out.Do = func(ctx context.Context, x *saga.StepTx) error {
			c, err := newCall(s, rt, eg, x)
			if err != nil {
				return err
			}
			run, err := c.when(st)
			if err != nil {
				return err
			}
			if !run {
				return saga.Skip("when is false")
			}
			return do(ctx, x)
		}
	}
	if st.Compensate != nil {
		comp := st.Compensate
		out.Compensate = func(ctx context.Context, x *saga.StepTx) error {
			c, err := newCall(s, rt, eg, x)
			if err != nil {
				return err
			}
			c.vars[varStep] = stepVars(x.Instance.ID.String(), st.Name)
			if _, recorded := c.st.Steps[st.Name]; comp.readsOwnOutput && !recorded {
				// The step may have acted (a 5xx, no answer, a timeout)
				// but never completed, so the output this compensation
				// reads (a charge id) does not exist and it cannot name
				// what to undo. Skipping it could leave the effect in
				// place unseen (a customer charged and never refunded):
				// the instance ends FAILED with the reason, for a person.
				return saga.Permanent(fmt.Errorf("the compensation of step %s reads the step's output, which the step never recorded (it may have acted: an error after sending, no answer or a timeout), so it cannot name what to undo; "+
					"undo it by hand, or write the compensation by step.idempotency_key (%s), the key the step's calls carried, then retry", st.Name, c.vars[varStep].(map[string]any)["idempotency_key"]))
			}
			if err := c.act(ctx, comp, st, true); err != nil {
				return err
			}
			return c.emit(ctx, comp)
		}
	}
	return out
}

// stepVars is step.* in a compensation: the step's name and the
// Idempotency-Key its http calls carried (act builds the same).
func stepVars(instance, step string) map[string]any {
	return map[string]any{"name": step, "idempotency_key": instance + ":" + step}
}

// finish computes the output, writes the emitted rows and saves the state.
func (c *call) finish(ctx context.Context, st *Step, a *Action) error {
	if err := c.emit(ctx, a); err != nil {
		return err
	}
	if st.Output == nil {
		if a.Command == nil {
			c.x.Output = nil
		}
		return nil
	}
	v, err := st.Output.eval(c.vars)
	if err != nil {
		return evalErr(err)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return saga.Permanent(fmt.Errorf("step %s: output cannot be written as JSON: %v", st.Name, err))
	}
	c.x.Output = b
	c.st.Steps[st.Name] = v
	sb, err := json.Marshal(c.st)
	if err != nil {
		return saga.Permanent(err)
	}
	c.x.State = sb
	return nil
}

func (c *call) emit(ctx context.Context, a *Action) error {
	if len(a.Emit) == 0 {
		return nil
	}
	msgs := make([]outbox.Message, 0, len(a.Emit))
	for _, m := range a.Emit {
		msg, err := c.message(m)
		if err != nil {
			return err
		}
		msgs = append(msgs, msg)
	}
	return c.x.Emit(ctx, msgs...)
}

func (c *call) message(m *Message) (outbox.Message, error) {
	msg := outbox.Message{EventType: m.EventType}
	var err error
	if msg.AggregateType, err = m.AggregateType.evalText(c.vars); err != nil {
		return msg, evalErr(err)
	}
	if msg.AggregateID, err = m.AggregateID.evalText(c.vars); err != nil {
		return msg, evalErr(err)
	}
	p, err := m.Payload.eval(c.vars)
	if err != nil {
		return msg, evalErr(err)
	}
	if p == nil {
		p = map[string]any{}
	}
	msg.Payload = p
	if len(m.Headers) > 0 {
		msg.Headers = map[string]string{}
		for _, h := range m.Headers {
			v, err := h.value.evalText(c.vars)
			if err != nil {
				return msg, evalErr(err)
			}
			msg.Headers[h.name] = v
		}
	}
	return msg, nil
}

// act runs the action's sql or http (a command is sent by Do itself).
func (c *call) act(ctx context.Context, a *Action, st *Step, comp bool) error {
	switch {
	case a.SQL != nil:
		return c.runSQL(ctx, a.SQL, st.Errors)
	case a.HTTP != nil:
		key := stepVars(c.x.Instance.ID.String(), st.Name)["idempotency_key"].(string)
		if comp {
			key += ":compensate"
		}
		return c.runHTTP(ctx, a.HTTP, key, st.Errors)
	}
	return nil
}

// bindParam turns an evaluated value into what pgx binds: whole numbers
// as integers (so that they fit integer columns), maps and lists as JSON
// for jsonb.
func bindParam(v any) any {
	switch t := v.(type) {
	case float64:
		if t == math.Trunc(t) && math.Abs(t) < 1<<53 {
			return int64(t)
		}
	case map[string]any, []any:
		b, _ := json.Marshal(t)
		return string(b)
	}
	return v
}

func (c *call) runSQL(ctx context.Context, q *SQLAction, rules ErrorRules) error {
	params := make([]any, len(q.Params))
	for i, p := range q.Params {
		v, err := p.eval(c.vars)
		if err != nil {
			return evalErr(err)
		}
		params[i] = bindParam(v)
	}
	rows, err := c.x.Tx.Query(ctx, q.Query, params...)
	if err != nil {
		return sqlErr(err, rules)
	}
	var list []any
	fields := rows.FieldDescriptions()
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			rows.Close()
			return sqlErr(err, rules)
		}
		row := make(map[string]any, len(vals))
		for i, v := range vals {
			row[fields[i].Name] = jsonValue(v)
		}
		list = append(list, row)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return sqlErr(err, rules)
	}
	n := rows.CommandTag().RowsAffected()
	if list == nil {
		list = []any{}
	}
	c.vars[varResult] = map[string]any{"rows": list, "rows_affected": n}
	got := int64(len(list))
	if got == 0 {
		got = n
	}
	switch q.Expect {
	case "one_row":
		if got != 1 {
			return saga.Permanent(fmt.Errorf("sql expected one row, got %d", got))
		}
	case "some_rows":
		if got == 0 {
			return saga.Permanent(errors.New("sql expected some rows, got none"))
		}
	}
	return nil
}

// jsonValue turns what pgx decoded into a JSON value.
func jsonValue(v any) any {
	switch t := v.(type) {
	case nil, bool, string, float64, map[string]any, []any:
		return t
	case int64:
		return t
	case int32:
		return int64(t)
	case int16:
		return int64(t)
	case int8:
		return int64(t)
	case float32:
		return float64(t)
	case [16]byte:
		return uuid.UUID(t).String()
	case time.Time:
		return t.UTC().Format(time.RFC3339Nano)
	case pgtype.Numeric:
		if i, err := t.Int64Value(); err == nil && i.Valid {
			if f, _ := t.Float64Value(); f.Float64 == float64(i.Int64) {
				return i.Int64
			}
		}
		if f, err := t.Float64Value(); err == nil && f.Valid {
			return f.Float64
		}
		return nil
	case []byte:
		return string(t)
	case netipPrefixer:
		return t.String()
	}
	b, err := json.Marshal(v)
	if err == nil {
		var out any
		if json.Unmarshal(b, &out) == nil {
			return plain(out)
		}
	}
	return fmt.Sprint(v)
}

type netipPrefixer interface{ String() string }

// httpErr is a failed call, already classified.
func (c *call) runHTTP(ctx context.Context, h *HTTPAction, key string, rules ErrorRules) error {
	secrets := map[string]string{}
	sv := map[string]any{}
	for _, name := range h.secretNames() {
		v, ok := c.rt.secret(name)
		if !ok {
			return saga.Permanent(fmt.Errorf("secret %s is not set: set %s%s for the relay", name, SecretEnvPrefix, name))
		}
		secrets[name] = v
		sv[name] = v
	}
	vars := make(map[string]any, len(c.vars)+1)
	for k, v := range c.vars {
		vars[k] = v
	}
	vars[varSecrets] = sv
	redact := func(s string) string {
		for name, v := range secrets {
			if v != "" {
				s = strings.ReplaceAll(s, v, "<secret "+name+">")
			}
		}
		return s
	}
	scrub := func(err error) error {
		if err == nil {
			return nil
		}
		// The text loses the secrets; the markers the runner reads are
		// kept.
		msg := errors.New(redact(err.Error()))
		switch {
		case errors.Is(err, saga.ErrNeedsOperator):
			msg = saga.NeedsOperator(msg)
		case errors.Is(err, saga.ErrTransient):
			msg = saga.Transient(msg)
		case saga.IsPermanent(err):
			msg = saga.Permanent(msg)
		case errors.Is(err, saga.ErrMayHaveActed):
			msg = saga.MayHaveActed(msg)
		}
		if d, ok := saga.RetryAfterOf(err); ok {
			msg = saga.RetryAfter(msg, d)
		}
		return msg
	}
	url, err := h.URL.evalURL(vars)
	if err != nil {
		return scrub(evalErr(err))
	}
	var body io.Reader
	if h.Body != nil {
		v, err := h.Body.eval(c.vars)
		if err != nil {
			return evalErr(err)
		}
		b, err := json.Marshal(v)
		if err != nil {
			return saga.Permanent(err)
		}
		body = bytes.NewReader(b)
	}
	u, err := neturl.Parse(url)
	if err != nil {
		return scrub(saga.Permanent(fmt.Errorf("http %s: the URL is not a URL: %v", h.Method, err)))
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return scrub(saga.Permanent(fmt.Errorf("http %s: scheme %q is refused: an http step calls only http:// and https:// URLs", h.Method, u.Scheme)))
	}
	if u.Host == "" {
		return scrub(saga.Permanent(fmt.Errorf("http %s: the URL has no host", h.Method)))
	}
	// As written in the file, or checked against the egress allow list.
	literal := h.LiteralHost != "" && strings.EqualFold(u.Host, h.LiteralHost)
	if !literal {
		if err := c.eg.policy.precheck(u.Hostname()); err != nil {
			return scrub(saga.Permanent(fmt.Errorf("http %s: %v", h.Method, err)))
		}
	}
	req, err := http.NewRequestWithContext(ctx, h.Method, url, body)
	if err != nil {
		return scrub(saga.Permanent(fmt.Errorf("http: %v", err)))
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	for _, hd := range h.Headers {
		v, err := hd.value.evalText(vars)
		if err != nil {
			return scrub(evalErr(err))
		}
		req.Header.Set(hd.name, v)
	}
	req.Header.Set("Idempotency-Key", key)
	span := tracing.HTTPClient(ctx, req)
	resp, err := c.eg.client(literal, h.FollowRedirects).Do(req)
	tracing.EndHTTP(span, resp, err)
	if egErr := new(EgressError); errors.As(err, &egErr) {
		// Refused at the dial: no connection was made, nothing was sent.
		return scrub(saga.Permanent(fmt.Errorf("http %s: %v", h.Method, egErr)))
	}
	if err != nil {
		if saga.Unreachable(err) {
			// Not listening, no such name, a TLS handshake refused:
			// nothing was sent, and only an operator can fix it.
			return scrub(saga.NeedsOperator(fmt.Errorf("http %s: %v", h.Method, err)))
		}
		// No answer: the service may have acted before the connection
		// broke.
		return scrub(saga.MayHaveActed(fmt.Errorf("http %s: %v", h.Method, err)))
	}
	raw, rerr := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	resp.Body.Close()
	st := resp.StatusCode
	if st < 200 || st >= 300 {
		e := fmt.Errorf("http %s answered %d %s", h.Method, st, snippet(raw, redact))
		if ruled := rules.apply(strconv.Itoa(st), e, nil); ruled != nil {
			if d, ok := retryAfter(resp.Header.Get("Retry-After")); ok {
				ruled = saga.RetryAfter(ruled, d)
			}
			return scrub(ruled)
		}
	}
	switch {
	case st >= 200 && st < 300:
		if rerr != nil {
			return scrub(saga.MayHaveActed(fmt.Errorf("http %s: reading the %d response: %v", h.Method, st, rerr)))
		}
	case st >= 300 && st < 400:
		// Not followed: the request, its headers and secrets go only to
		// the URL the saga names.
		return scrub(saga.Permanent(fmt.Errorf("http %s answered %d: redirected to %s; call the URL it redirects to, or set follow_redirects: same_origin for a redirect within the same host",
			h.Method, st, redirectHost(resp))))
	case st == http.StatusRequestTimeout || st == http.StatusTooManyRequests || st >= 500:
		err := saga.MayHaveActed(fmt.Errorf("http %s answered %d %s", h.Method, st, snippet(raw, redact)))
		if d, ok := retryAfter(resp.Header.Get("Retry-After")); ok {
			err = saga.RetryAfter(err, d)
		}
		return scrub(err)
	default:
		return scrub(saga.Permanent(fmt.Errorf("http %s answered %d %s", h.Method, st, snippet(raw, redact))))
	}
	var b any = string(raw)
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var j any
	if len(bytes.TrimSpace(raw)) > 0 && d.Decode(&j) == nil {
		b = plain(j)
	}
	hdr := map[string]any{}
	for k, v := range resp.Header {
		hdr[strings.ToLower(k)] = strings.Join(v, ", ")
	}
	c.vars[varResponse] = map[string]any{"status": int64(st), "headers": hdr, "body": b}
	return nil
}

// snippetLen is how much of a response body an error shows.
const snippetLen = 200

// snippet is the start of a response body for an error. Secrets are masked
// in the whole body first: cut first, a secret that straddles the cut would
// keep its first half, which no longer matches the secret.
func snippet(b []byte, redact func(string) string) string {
	s := redact(strings.TrimSpace(string(b)))
	if len(s) > snippetLen {
		cut := snippetLen
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	if s == "" {
		return ""
	}
	return "(" + strconv.Quote(s) + ")"
}

// retryAfter reads a Retry-After header: seconds or an HTTP date.
func retryAfter(v string) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 0 {
		return time.Duration(min(n, 86400)) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0), true
	}
	return 0, false
}

// when evaluates a step's when: whether the step runs.
func (c *call) when(st *Step) (bool, error) {
	v, err := st.When.eval(c.vars)
	if err != nil {
		return false, evalErr(err)
	}
	b, ok := v.(bool)
	if !ok {
		e := st.When.single
		return false, saga.Permanent(fmt.Errorf("%s:%d:%d: step %s: when gave %s, not true or false", e.file, e.line, e.col, st.Name, jsonText(v)))
	}
	return b, nil
}

// wait returns the saga.WaitUntil of a wait step.
func (c *call) wait(wa *WaitAction) error {
	until, err := c.waitUntil(wa, time.Now())
	if err != nil {
		return err
	}
	return saga.WaitUntil(until)
}

// waitUntil is when a wait step started at now ends.
func (c *call) waitUntil(wa *WaitAction, now time.Time) (time.Time, error) {
	if wa.Until == nil {
		return now.Add(wa.Duration), nil
	}
	v, err := wa.Until.eval(c.vars)
	if err != nil {
		return time.Time{}, evalErr(err)
	}
	text, _ := v.(string)
	t, perr := time.Parse(time.RFC3339Nano, text)
	if perr != nil {
		e := wa.Until.single
		return time.Time{}, saga.Permanent(fmt.Errorf("%s:%d:%d: wait.until gave %s, not an RFC 3339 timestamp such as 2030-01-01T00:00:00Z", e.file, e.line, e.col, jsonText(v)))
	}
	return t, nil
}
