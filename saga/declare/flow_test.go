package declare

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
)

// TestLoadBrokenFlow: when, wait and on_timeout misused are reported at
// their place with a fix.
func TestLoadBrokenFlow(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		body string
		want []string
	}{
		{"when not one expression", head + "steps:\n  - name: a\n    when: \"amount > 1\"\n    emit: [{event_type: x}]\n",
			[]string{`f.yaml:6:11: step a.when must be one expression, "${ … }", that gives true or false; write e.g. when: "${ trigger.payload.amount > 100 }"`}},
		{"when not a bool", head + "steps:\n  - name: a\n    when: \"${ 'yes' }\"\n    emit: [{event_type: x}]\n",
			[]string{`f.yaml:6:14: step a.when gives string, not true or false; compare it, e.g. ${ x > 0 } or ${ x == 'gold' }`}},
		{"when reads a later step", head + "steps:\n  - name: a\n    when: \"${ steps.b.x == 1 }\"\n    emit: [{event_type: x}]\n  - name: b\n    sql: {query: \"select 1 AS x\"}\n    output: {x: 1}\n",
			[]string{`f.yaml:6:21: steps.b is a later step; an expression can read only the outputs of the steps before it`}},
		{"wait with both", head + "steps:\n  - name: a\n    wait: {duration: 1h, until: \"${ trigger.payload.at }\"}\n",
			[]string{`f.yaml:6:26: step a.wait has both duration and until; keep one`}},
		{"wait with neither", head + "steps:\n  - name: a\n    wait: {}\n",
			[]string{`f.yaml:6:5: step a.wait says neither how long nor until when; give duration: 2h or until: "${ … }" (a timestamp)`}},
		{"wait bad duration", head + "steps:\n  - name: a\n    wait: {duration: soon}\n",
			[]string{`f.yaml:6:22: steps[0].wait.duration is "soon", not a duration; write a Go duration such as 200ms, 10s or 2m`}},
		{"wait until not a timestamp", head + "steps:\n  - name: a\n    wait: {until: \"${ 3 }\"}\n",
			[]string{`f.yaml:6:22: step a.wait.until gives int, not a timestamp; write ${ timestamp('2030-01-01T00:00:00Z') } or an expression on RFC 3339 text, e.g. ${ timestamp(trigger.payload.ship_at) }`}},
		{"wait with an action", head + "steps:\n  - name: a\n    wait: {duration: 1h}\n    sql: {query: \"select 1\"}\n",
			[]string{`f.yaml:7:5: step a waits and has sql: a wait step only waits; put sql in a step of its own before or after it`}},
		{"concurrency key not keyed", "saga: s\nversion: 1\ntriggers: [{event_type: e}]\nconcurrency: {key: all, limit: 1}\nsteps:\n  - name: a\n    emit: [{event_type: x}]\n",
			[]string{`f.yaml:4:20: concurrency.key "all" is the same for every instance, so they would all run one after the other; key it by the event, e.g. key: "${ trigger.aggregate_id }"`}},
		{"concurrency key reads a step", "saga: s\nversion: 1\ntriggers: [{event_type: e}]\nconcurrency: {key: \"${ steps.a.x }\", limit: 1}\nsteps:\n  - name: a\n    emit: [{event_type: x}]\n",
			[]string{`f.yaml:4:30: steps are not available in concurrency.key; the concurrency key, computed when the instance starts, sees only the event (trigger.*) and saga.name and saga.version`}},
		{"concurrency limit zero", "saga: s\nversion: 1\ntriggers: [{event_type: e}]\nconcurrency: {key: \"${ trigger.aggregate_id }\", limit: 0}\nsteps:\n  - name: a\n    emit: [{event_type: x}]\n",
			[]string{`f.yaml:4:56: concurrency.limit is 0; it must be at least 1`}},
		{"concurrency without limit", "saga: s\nversion: 1\ntriggers: [{event_type: e}]\nconcurrency: {key: \"${ trigger.aggregate_id }\"}\nsteps:\n  - name: a\n    emit: [{event_type: x}]\n",
			[]string{`f.yaml:4:14: missing key "limit" in concurrency; add it`}},
		{"bad rate", head + "steps:\n  - name: a\n    rate: fast\n    emit: [{event_type: x}]\n",
			[]string{`f.yaml:6:11: step a.rate is "fast", not a rate; write how many starts per second, minute or hour, e.g. rate: 50/s, 100/m or 1000/h, or rate: {limit: 50/s, per: tenant}`}},
		{"zero rate", head + "steps:\n  - name: a\n    rate: 0/s\n    emit: [{event_type: x}]\n",
			[]string{`f.yaml:6:11: step a.rate "0/s" must allow at least 1 and at most 1000000 starts per second; write how many starts per second, minute or hour, e.g. rate: 50/s, 100/m or 1000/h, or rate: {limit: 50/s, per: tenant}`}},
		{"bad rate limit", head + "steps:\n  - name: a\n    rate: {limit: 5/d, per: tenant}\n    emit: [{event_type: x}]\n",
			[]string{`f.yaml:6:19: step a.rate.limit is "5/d", not a rate; write how many starts per second, minute or hour, e.g. rate: 50/s, 100/m or 1000/h, or rate: {limit: 50/s, per: tenant}`}},
		{"rate per what", head + "steps:\n  - name: a\n    rate: {limit: 5/s, per: customer}\n    emit: [{event_type: x}]\n",
			[]string{`f.yaml:6:29: steps[0].rate.per is customer; use one of: saga, tenant`}},
		{"rate without limit", head + "steps:\n  - name: a\n    rate: {per: tenant}\n    emit: [{event_type: x}]\n",
			[]string{`f.yaml:6:11: missing key "limit" in steps[0].rate; add it`}},
		{"bad on_timeout", head + "steps:\n  - name: a\n    command: {event_type: c, reply_timeout: 1s, on_timeout: skip}\n",
			[]string{`f.yaml:6:61: steps[0].command.on_timeout is skip; use one of: retry, compensate, fail`}},
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
		})
	}
}

// TestLoadRate: the shorthand is one limit per saga and step, shared by
// every tenant; per: tenant keys it by tenant too.
func TestLoadRate(t *testing.T) {
	t.Parallel()
	s, probs := LoadFile("f.yaml", []byte(head+"steps:\n  - name: a\n    rate: 20/s\n    emit: [{event_type: x}]\n"+
		"  - name: b\n    rate: {limit: 5/m, per: tenant}\n    emit: [{event_type: y}]\n  - name: c\n    rate: {limit: 1/h, per: saga}\n    emit: [{event_type: z}]\n"), Options{})
	if probs != nil {
		t.Fatal(probs)
	}
	for i, want := range []saga.Rate{{Count: 20, Per: time.Second}, {Count: 5, Per: time.Minute, PerTenant: true}, {Count: 1, Per: time.Hour}} {
		if got := s.Steps[i].Rate; got == nil || *got != want {
			t.Errorf("step %d: rate %+v, want %+v", i, got, want)
		}
	}
	tenant := uuid.MustParse("11111111-2222-3333-4444-555555555555")
	if got := s.Steps[0].Rate.Key("s", "a", tenant); got != "s.a" {
		t.Errorf("per-saga key %q", got)
	}
	if got := s.Steps[1].Rate.Key("s", "b", tenant); got != "s.b/"+tenant.String() {
		t.Errorf("per-tenant key %q", got)
	}
}

const flowSaga = `saga: flow
version: 1
triggers: [{event_type: order.placed}]
concurrency: {key: "account-${ trigger.payload.tier }", limit: 2}
steps:
  - name: reserve
    sql: {query: "select 1"}
    compensate: {sql: {query: "select 2"}}
  - name: vip_gift
    when: "${ trigger.payload.tier == 'gold' }"
    sql: {query: "select 3"}
    compensate: {sql: {query: "select 4"}}
  - name: cool_off
    wait: {duration: 2h}
  - name: ship_at
    wait: {until: "${ trigger.payload.ship_at }"}
  - name: ship
    command: {event_type: ship.requested, reply_timeout: 1m, on_timeout: compensate}
`

// TestWalkFlow: the walk skips a step whose when is false (it is not among
// the steps that ran, nor compensated), shows waits and goes on.
func TestWalkFlow(t *testing.T) {
	t.Parallel()
	s, probs := LoadFile("flow.yaml", []byte(flowSaga), Options{})
	if probs != nil {
		t.Fatal(probs)
	}
	var out strings.Builder
	res, err := Walk(s, WalkInput{Trigger: json.RawMessage(`{"event_type":"order.placed","payload":{"tier":"silver","ship_at":"2030-01-02T03:04:05Z"}}`),
		Replies: map[string]json.RawMessage{"ship": json.RawMessage(`{"error":"no truck"}`)}}, &out)
	if err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, want := range []string{
		"2. vip_gift (sql)\n   skipped (when is false)\n",
		"3. cool_off (wait)\n   waits 2h (no worker held), then goes on\n",
		"4. ship_at (wait)\n   waits until 2030-01-02T03:04:05Z (no worker held), then goes on\n",
		"waits up to 1m0s for the reply (none in time: compensate at once)",
		"compensate 2. vip_gift: nothing to undo (skipped)",
		"concurrency key \"account-silver\": runs once fewer than 2 older instances of it are unfinished\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("walk output lacks %q:\n%s", want, text)
		}
	}
	if got := strings.Join(res.Steps, ","); got != "reserve,cool_off,ship_at,ship" {
		t.Errorf("steps run: %s", got)
	}
	if got := strings.Join(res.Compensations, ","); res.Status != WalkCompensated || got != "reserve" {
		t.Errorf("status %s, compensations %s", res.Status, got)
	}

	out.Reset()
	res, err = Walk(s, WalkInput{Trigger: json.RawMessage(`{"event_type":"order.placed","payload":{"tier":"gold","ship_at":"soon"}}`)}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(res.Steps, ","); got != "reserve,vip_gift,cool_off,ship_at" || res.Status != WalkCompensated {
		t.Errorf("steps run: %s, status %s", got, res.Status)
	}
	if !strings.Contains(res.Reason, `wait.until gave "soon", not an RFC 3339 timestamp`) {
		t.Errorf("reason: %s", res.Reason)
	}
}

// TestRunTestsFlow: a test file's expect.steps lists only the steps that
// ran (a skipped one is not among them), and a wrong one fails with a diff.
func TestRunTestsFlow(t *testing.T) {
	t.Parallel()
	s, probs := LoadFile("flow.yaml", []byte(flowSaga), Options{})
	if probs != nil {
		t.Fatal(probs)
	}
	body := `saga: flow
cases:
  - name: silver skips the gift
    trigger: {event_type: order.placed, payload: {tier: silver, ship_at: "2030-01-02T03:04:05Z"}}
    expect: {status: COMPLETED, steps: [reserve, cool_off, ship_at, ship], compensations: []}
  - name: gold gets the gift (wrong on purpose)
    trigger: {event_type: order.placed, payload: {tier: gold, ship_at: "2030-01-02T03:04:05Z"}}
    expect: {status: COMPLETED, steps: [reserve, cool_off, ship_at, ship]}
`
	tf, probs := LoadTestFile("flow.test.yaml", []byte(body))
	if probs != nil {
		t.Fatal(probs)
	}
	var out strings.Builder
	passed, failed := RunTests(&out, []*Saga{s}, []*TestFile{tf})
	if passed != 1 || failed != 1 {
		t.Fatalf("passed %d, failed %d:\n%s", passed, failed, out.String())
	}
	if !strings.Contains(out.String(), "PASS flow.test.yaml:3:5 silver skips the gift") ||
		!strings.Contains(out.String(), `reserve, vip_gift, cool_off, ship_at, ship`) {
		t.Errorf("output:\n%s", out.String())
	}
}

// A test file's rows take what --rows takes: a list of row objects, or the
// number of rows a statement without RETURNING affects.
func TestTestFileRowsTakeACount(t *testing.T) {
	t.Parallel()
	s, probs := LoadFile("rec.yaml", []byte(`saga: rec
version: 1
triggers: [{event_type: order.placed}]
steps:
  - name: record
    sql: {query: "update orders set seen = true where id = 1", expect: one_row}
`), Options{})
	if probs != nil {
		t.Fatal(probs)
	}
	body := `saga: rec
cases:
  - name: one row updated
    trigger: {event_type: order.placed, payload: {}}
    rows: {record: 1}
    expect: {status: COMPLETED, steps: [record]}
  - name: no row updated
    trigger: {event_type: order.placed, payload: {}}
    rows: {record: 0}
    expect: {status: COMPENSATED, reason_contains: "one row, got 0"}
  - name: rows as a list
    trigger: {event_type: order.placed, payload: {}}
    rows: {record: [{id: 1}]}
    expect: {status: COMPLETED}
`
	tf, probs := LoadTestFile("rec.test.yaml", []byte(body))
	if probs != nil {
		t.Fatal(probs)
	}
	var out strings.Builder
	if passed, failed := RunTests(&out, []*Saga{s}, []*TestFile{tf}); passed != 3 || failed != 0 {
		t.Fatalf("passed %d, failed %d:\n%s", passed, failed, out.String())
	}
	for _, bad := range []string{"-1", "1.5", `"one"`, "{a: 1}"} {
		_, probs := LoadTestFile("bad.test.yaml", []byte(strings.Replace(body, "{record: 1}", "{record: "+bad+"}", 1)))
		if probs == nil {
			t.Errorf("rows: {record: %s} is accepted", bad)
		}
	}
}
