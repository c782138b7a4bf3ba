package saga_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/compensa/compensa/saga"
)

func noop(context.Context, *saga.StepTx) error { return nil }

func validDef() saga.Definition {
	return saga.Definition{
		Name: "orders", Version: 1,
		Triggers: []saga.Trigger{{EventType: "order.placed"}},
		Steps:    []saga.Step{{Name: "reserve", Do: noop}, {Name: "charge", Do: noop}},
	}
}

func TestRegistryRejectsInvalidStepsNamingTheField(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		edit  func(*saga.Step)
		field string
	}{
		{"no Do", func(s *saga.Step) { s.Do = nil }, "Steps[1].Do is nil"},
		{"negative timeout", func(s *saga.Step) { s.Timeout = -time.Second }, "Steps[1].Timeout"},
		{"negative reply timeout", func(s *saga.Step) { s.ReplyTimeout = -1 }, "Steps[1].ReplyTimeout"},
		{"OnReply without wait", func(s *saga.Step) {
			s.OnReply = func(context.Context, *saga.StepTx, saga.Reply) error { return nil }
		}, "Steps[1].OnReply"},
		{"negative attempts", func(s *saga.Step) { s.Retry.MaxAttempts = -1 }, "Steps[1].Retry.MaxAttempts"},
		{"negative base", func(s *saga.Step) { s.Retry.Base = -time.Second }, "Steps[1].Retry.Base"},
		{"factor below one", func(s *saga.Step) { s.Retry.Factor = 0.5 }, "Steps[1].Retry.Factor"},
		{"jitter above one", func(s *saga.Step) { s.Retry.Jitter = 1.5 }, "Steps[1].Retry.Jitter"},
		{"cap below base", func(s *saga.Step) { s.Retry.Base, s.Retry.Max = time.Minute, time.Second }, "Steps[1].Retry.Max"},
		{"compensation cap below base", func(s *saga.Step) {
			s.CompensationRetry.Base, s.CompensationRetry.Max = time.Hour, time.Minute
		}, "Steps[1].CompensationRetry.Max"},
		{"compensation attempts", func(s *saga.Step) { s.CompensationRetry.MaxAttempts = -3 }, "Steps[1].CompensationRetry.MaxAttempts"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := validDef()
			tc.edit(&d.Steps[1])
			err := saga.NewRegistry().Register(d)
			if !errors.Is(err, saga.ErrInvalid) {
				t.Fatalf("Register: got %v, want ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tc.field) || !strings.Contains(err.Error(), "orders@v1") {
				t.Fatalf("message %q does not name %q and the definition", err, tc.field)
			}
		})
	}
}

func TestRegistryAcceptsLargeBaseWithoutCap(t *testing.T) {
	t.Parallel()
	d := validDef()
	// A Base above the default cap and no Max: the cap follows Base rather
	// than refusing a field the author never set.
	d.Steps[0].Retry.Base = 20 * time.Minute
	if err := saga.NewRegistry().Register(d); err != nil {
		t.Fatal(err)
	}
	eff := d.Steps[0].Retry.WithDefaults(saga.DefaultStepRetry)
	if eff.Max != 20*time.Minute {
		t.Fatalf("Max = %s, want 20m", eff.Max)
	}
}

func TestRegistryVersions(t *testing.T) {
	t.Parallel()
	r := saga.NewRegistry()
	v1, v2 := validDef(), validDef()
	v2.Version = 2
	r.MustRegister(v2, v1)
	if err := r.Register(v1); !errors.Is(err, saga.ErrConflict) {
		t.Fatalf("duplicate: got %v, want ErrConflict", err)
	}
	if d, ok := r.Latest("orders"); !ok || d.Version != 2 {
		t.Fatalf("Latest = v%d %v, want v2", d.Version, ok)
	}
	if _, ok := r.Lookup("orders", 1); !ok {
		t.Fatal("v1 must stay registered for the instances pinned to it")
	}
	if _, ok := r.Lookup("orders", 3); ok {
		t.Fatal("Lookup found an unregistered version")
	}
}

func TestRetryDefaultsAndBackoff(t *testing.T) {
	t.Parallel()
	step := saga.RetryPolicy{}.WithDefaults(saga.DefaultStepRetry)
	if step != saga.DefaultStepRetry {
		t.Fatalf("zero step policy = %+v, want the default %+v", step, saga.DefaultStepRetry)
	}
	comp := saga.RetryPolicy{}.WithDefaults(saga.DefaultCompensationRetry)
	if comp.MaxAttempts <= step.MaxAttempts || comp.Max <= step.Max {
		t.Fatalf("compensation policy %+v is not more patient than the step's %+v", comp, step)
	}
	// Without jitter (r = 0): 1s, 2s, 4s, ... capped at 5 minutes.
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second}
	for i, w := range want {
		if got := step.DelayAt(i+1, 0); got != w {
			t.Fatalf("delay after attempt %d = %s, want %s", i+1, got, w)
		}
	}
	for _, n := range []int{10, 11, 60, 5000} {
		if got := step.DelayAt(n, 0); got != 5*time.Minute {
			t.Fatalf("delay after attempt %d = %s, want the 5m cap", n, got)
		}
	}
	// Jitter only shortens: the cap stays a cap, and the floor is d·(1−J).
	if got := step.DelayAt(3, 0.999999); got < time.Duration(float64(4*time.Second)*0.8) || got > 4*time.Second {
		t.Fatalf("jittered delay %s outside [3.2s, 4s]", got)
	}
	for range 1000 {
		d := step.Delay(20)
		if d > 5*time.Minute || d < 4*time.Minute {
			t.Fatalf("jittered capped delay %s outside [4m, 5m]", d)
		}
	}
	noJitter := saga.RetryPolicy{Base: 10 * time.Millisecond, Jitter: -1}.WithDefaults(saga.DefaultStepRetry)
	if noJitter.Jitter != 0 || noJitter.Delay(2) != 20*time.Millisecond {
		t.Fatalf("negative Jitter must disable it: %+v delay %s", noJitter, noJitter.Delay(2))
	}
}

func TestParseReply(t *testing.T) {
	t.Parallel()
	cases := []struct {
		payload   string
		ok, perm  bool
		errSubstr string
	}{
		{`{"ok":true,"id":"x"}`, true, false, ""},
		{`{"document_id":"x"}`, true, false, ""},
		{`{"error":null}`, true, false, ""},
		{`{"error":""}`, true, false, ""},
		{`{"error":"quota exceeded"}`, false, false, "quota exceeded"},
		{`{"error":"bad input","permanent":true}`, false, true, "bad input"},
		{`{"ok":false}`, false, false, `"ok": false`},
		{`{"error":{"code":7}}`, false, false, `"code"`},
		{`[1,2]`, false, true, "not a JSON object"},
		{`not json`, false, true, "not a JSON object"},
		{``, false, true, "not a JSON object"},
	}
	for _, tc := range cases {
		r := saga.ParseReply(json.RawMessage(tc.payload))
		if r.OK != tc.ok || r.Permanent != tc.perm || !strings.Contains(r.Error, tc.errSubstr) {
			t.Errorf("ParseReply(%s) = %+v, want ok=%v permanent=%v error~%q", tc.payload, r, tc.ok, tc.perm, tc.errSubstr)
		}
	}
}
