package declare

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// head is the start every broken definition below shares: lines 1-3.
const head = "saga: s\nversion: 1\ntriggers: [{event_type: e}]\n"

// TestLoadBroken loads broken definitions, each with the exact place and
// message expected.
func TestLoadBroken(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		body string
		want []string
	}{
		{"yaml syntax", head + "steps:\n  - name: a\n   sql: {query: x}\n",
			[]string{`f.yaml:4:1: YAML syntax: did not find expected '-' indicator; fix the syntax`}},
		{"unknown top-level key", head + "stpes: []\nsteps:\n  - name: a\n    emit: [{event_type: x}]\n",
			[]string{`f.yaml:4:1: unknown key "stpes" in the file; did you mean "steps"?`}},
		{"missing key", "version: 1\ntriggers: [{event_type: e}]\nsteps:\n  - name: a\n    emit: [{event_type: x}]\n",
			[]string{`f.yaml:1:1: missing key "saga" in the file; add it`}},
		{"wrong type", "saga: s\nversion: one\ntriggers: [{event_type: e}]\nsteps:\n  - name: a\n    emit: [{event_type: x}]\n",
			[]string{`f.yaml:2:10: version must be integer, not string; write a whole number`}},
		{"bad duration", head + "deadline: 10x\nsteps:\n  - name: a\n    emit: [{event_type: x}]\n",
			[]string{`f.yaml:4:11: deadline is "10x", not a duration; write a Go duration such as 200ms, 10s or 2m`}},
		{"unknown step key", head + "steps:\n  - name: a\n    emit: [{event_type: x}]\n    outptu: {}\n",
			[]string{`f.yaml:7:5: unknown key "outptu" in steps[0]; did you mean "output"?`}},
		{"cel syntax", head + "steps:\n  - name: a\n    emit: [{event_type: x, payload: \"${ trigger.payload. }\"}]\n",
			[]string{`f.yaml:6:58: Syntax error: no viable alternative at input '. ' in step a.emit[0].payload; fix the CEL syntax`}},
		{"undeclared name", head + "steps:\n  - name: a\n    emit: [{event_type: x, payload: \"${ order.id }\"}]\n",
			[]string{`f.yaml:6:41: undeclared reference to 'order' in step a.emit[0].payload; the names in scope are trigger, saga, steps, and after a step's action result, response or reply`}},
		{"type mismatch", head + "steps:\n  - name: a\n    emit: [{event_type: x, aggregate_id: \"${ 'a' + 1 }\"}]\n",
			[]string{`f.yaml:6:50: found no matching overload for '_+_' applied to '(string, int)' in step a.emit[0].aggregate_id; convert one side, e.g. string(x) or int(x)`}},
		{"later step", head + "steps:\n  - name: a\n    sql: {query: \"select $1\", params: [\"${ steps.b.x }\"]}\n  - name: b\n    sql: {query: \"select 1 AS x\"}\n    output: {x: 1}\n",
			[]string{`f.yaml:6:50: steps.b is a later step; an expression can read only the outputs of the steps before it`}},
		{"unknown step", head + "steps:\n  - name: a\n    sql: {query: \"select $1\", params: [\"${ steps.nope }\"]}\n",
			[]string{`f.yaml:6:50: steps.nope names no step of this saga; use one of the steps before this one`}},
		{"own output forward", head + "steps:\n  - name: a\n    sql: {query: \"select $1\", params: [\"${ steps.a.x }\"]}\n    output: {x: 1}\n",
			[]string{`f.yaml:6:50: steps.a is this step's own output, which does not exist yet; read it only in the step's compensate`}},
		{"step without output", head + "steps:\n  - name: a\n    sql: {query: \"select 1\"}\n  - name: b\n    sql: {query: \"select $1\", params: [\"${ steps.a.x }\"]}\n",
			[]string{`f.yaml:8:50: step a declares no output; add output: { … } to step a`}},
		{"unknown output key", head + "steps:\n  - name: a\n    sql: {query: \"select 1 AS x\"}\n    output: {x: 1}\n  - name: b\n    sql: {query: \"select $1\", params: [\"${ steps.a.y }\"]}\n",
			[]string{`f.yaml:9:52: step a has no output "y"; its output has: x`}},
		{"secret in sql", head + "steps:\n  - name: a\n    sql: {query: \"select $1\", params: [\"${ secrets.TOKEN }\"]}\n",
			[]string{`f.yaml:6:44: secrets may not be used in step a.sql.params[0]; secrets are allowed only in http.url and http.headers, so that they never reach the journal`}},
		{"secret in body", head + "steps:\n  - name: a\n    http: {method: POST, url: \"http://x\", body: {t: \"${ secrets.TOKEN }\"}}\n",
			[]string{`f.yaml:6:57: secrets may not be used in step a.http.body.t; secrets are allowed only in http.url and http.headers, so that they never reach the journal`}},
		{"duplicate step name", head + "steps:\n  - name: a\n    emit: [{event_type: x}]\n  - name: a\n    emit: [{event_type: y}]\n",
			[]string{`f.yaml:7:11: step name "a" is used twice (first by step 1); give each step its own name`}},
		{"two kinds", head + "steps:\n  - name: a\n    sql: {query: \"select 1\"}\n    http: {method: GET, url: \"http://x\"}\n",
			[]string{`f.yaml:7:5: step a has more than one of sql, http, command; split it into one step per action`}},
		{"code in retry_on and fail_on", head + "steps:\n  - name: a\n    sql: {query: \"select 1\"}\n    retry_on: [\"23505\", 503]\n    fail_on: [\"23505\"]\n",
			[]string{`f.yaml:8:15: 23505 is in both retry_on and fail_on; keep it in one`}},
		{"not an HTTP status", head + "steps:\n  - name: a\n    sql: {query: \"select 1\"}\n    fail_on: [42]\n",
			[]string{`f.yaml:7:15: steps[0].fail_on[0] is 42; it must be at least 100`}},
		{"not a SQLSTATE", head + "steps:\n  - name: a\n    sql: {query: \"select 1\"}\n    retry_on: [\"2350\"]\n",
			[]string{`f.yaml:7:16: steps[0].retry_on[0] is "2350", not a SQLSTATE; write a five-character code such as "23505", a two-character class such as "40", or an HTTP status as a number`}},
		{"step does nothing", head + "steps:\n  - name: a\n    timeout: 1s\n",
			[]string{`f.yaml:5:5: step a does nothing; give it one of sql, http, command, or emit`}},
		{"response after sql", head + "steps:\n  - name: a\n    sql: {query: \"select 1\"}\n    output: {x: \"${ response.body }\"}\n",
			[]string{`f.yaml:7:21: response is not available in step a.output.x; response is what a step's own http call returned: use it only in that step's output and emit`}},
		{"unclosed expression", head + "steps:\n  - name: a\n    emit: [{event_type: x, aggregate_id: \"${ trigger.id\"}]\n",
			[]string{`f.yaml:6:43: ${ is not closed in step a.emit[0].aggregate_id; end the expression with }`}},
		{"expression in sql text", head + "steps:\n  - name: a\n    sql: {query: \"select ${ trigger.id }\"}\n",
			[]string{`f.yaml:6:18: step a.sql.query holds ${ … }: SQL text is never built from expressions; pass the value as a parameter ($1, $2, …) in params`}},
		{"bad method", head + "steps:\n  - name: a\n    http: {method: FETCH, url: \"http://x\"}\n",
			[]string{`f.yaml:6:20: steps[0].http.method is FETCH; use one of: GET, POST, PUT, PATCH, DELETE`}},
		{"bad expect", head + "steps:\n  - name: a\n    sql: {query: \"select 1\", expect: two_rows}\n",
			[]string{`f.yaml:6:38: steps[0].sql.expect is two_rows; use one of: any, one_row, some_rows`}},
		{"unknown trigger field", head + "steps:\n  - name: a\n    emit: [{event_type: x, aggregate_id: \"${ trigger.idd }\"}]\n",
			[]string{`f.yaml:6:54: trigger has no field "idd"; use one of: id, event_type, aggregate_type, aggregate_id, tenant_id, correlation_id, payload, headers`}},
		{"compensation command", head + "steps:\n  - name: a\n    emit: [{event_type: x}]\n    compensate:\n      command: {event_type: c, reply_timeout: 1s}\n",
			[]string{
				`f.yaml:8:7: unknown key "command" in steps[0].compensate; remove it or use one of: emit, http, sql`,
				`f.yaml:8:7: a compensation cannot wait for a reply; send the command with compensate.emit`,
			}},
		{"retry max below initial", head + "steps:\n  - name: a\n    emit: [{event_type: x}]\n    retry: {initial: 10s, max: 1s}\n",
			[]string{`f.yaml:7:27: retry.max (1s) is below retry.initial (10s); make max at least initial`}},
		{"duplicate yaml key", head + "steps:\n  - name: a\n    name: b\n    emit: [{event_type: x}]\n",
			[]string{`f.yaml:6:5: key "name" appears twice in this mapping; keep one`}},
		{"step name not an identifier", head + "steps:\n  - name: reserve-stock\n    emit: [{event_type: x}]\n",
			[]string{`f.yaml:5:11: step name "reserve-stock" is not an identifier; use letters, digits and _ (it is read as steps.<name> in expressions)`}},
		{"every error at once", "saga: s\nversion: 0\ntriggers: []\nsteps:\n  - name: a\n    emit: [{event_type: x, payload: \"${ nope }\"}]\n    colour: red\n",
			[]string{
				`f.yaml:2:10: version is 0; it must be at least 1`,
				`f.yaml:3:11: triggers is empty; give it at least 1 item(s)`,
				`f.yaml:6:41: undeclared reference to 'nope' in step a.emit[0].payload; the names in scope are trigger, saga, steps, and after a step's action result, response or reply`,
				`f.yaml:7:5: unknown key "colour" in steps[0]; remove it or use one of: command, compensate, compensation_retry, emit, fail_on, http, name, output, rate, retry, retry_on, sql, timeout, wait, when`,
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, probs := LoadFile("f.yaml", []byte(tc.body), Options{})
			if s != nil {
				t.Fatalf("loaded a broken definition:\n%s", tc.body)
			}
			got := strings.Split(probs.Error(), "\n")
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("problems:\n got: %q\nwant: %q", got, tc.want)
			}
			if !errors.Is(probs, ErrInvalid) {
				t.Error("Problems is not ErrInvalid")
			}
		})
	}
}

// TestLoadDirDuplicateVersion: one (saga, version) in two files is refused,
// naming both.
func TestLoadDirDuplicateVersion(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	body := head + "steps:\n  - name: a\n    emit: [{event_type: x}]\n"
	for _, f := range []string{"a.yaml", "b.yml"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	_, err := LoadDir(dir, Options{})
	want := filepath.Join(dir, "b.yml") + ":1:1: s version 1 is also declared in " + filepath.Join(dir, "a.yaml") + "; give one of them another version"
	if err == nil || err.Error() != want {
		t.Fatalf("got %v\nwant %s", err, want)
	}
}

// TestLoadExample loads the README's example and checks what it compiled to.
func TestLoadExample(t *testing.T) {
	t.Parallel()
	sagas, err := LoadDir("testdata/valid", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(sagas) != 1 {
		t.Fatalf("got %d sagas", len(sagas))
	}
	s := sagas[0]
	var kinds []string
	for _, st := range s.Steps {
		kinds = append(kinds, st.Name+":"+st.Kind())
	}
	if got := strings.Join(kinds, " "); got != "reserve_stock:sql charge_payment:http ship:command confirm:sql" {
		t.Fatalf("steps: %s", got)
	}
	if s.Name != "order_fulfilment" || s.Version != 1 || len(s.Hash) != 64 || s.Deadline.String() != "10m0s" {
		t.Fatalf("saga: %+v", s)
	}
	if st := s.Steps[0]; st.Retry.MaxAttempts != 5 || st.Timeout.String() != "10s" || st.CompensationRetry.MaxAttempts != 20 {
		t.Fatalf("defaults not applied: %+v", st)
	}
	// A comment or layout change does not change the hash; a value does.
	b := append([]byte("# a comment\n"), s.Body...)
	s2, ps := LoadFile("x.yaml", b, Options{})
	if ps != nil || s2.Hash != s.Hash {
		t.Fatalf("comment changed the hash: %v", ps)
	}
	s3, ps := LoadFile("x.yaml", []byte(strings.Replace(string(s.Body), "2m", "3m", 1)), Options{})
	if ps != nil || s3.Hash == s.Hash {
		t.Fatalf("a changed value kept the hash: %v", ps)
	}
	// relay run requires the secrets a file reads.
	_, ps = LoadFile("x.yaml", s.Body, Options{RequireSecrets: true, LookupEnv: func(string) (string, bool) { return "", false }})
	if len(ps) != 1 || !strings.Contains(ps[0].String(), "RELAY_SECRET_PAYMENTS_TOKEN is not set") {
		t.Fatalf("missing secret: %v", ps)
	}
}
