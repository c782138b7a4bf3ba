package httpapi_test

import (
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/compensa/compensa/saga"
)

// A retry through the API wakes the step runners, as the correlator does; a
// refused one does not.
func TestRetryWakesTheRunners(t *testing.T) {
	t.Parallel()
	var woken atomic.Int64
	b := setup(t, options{token: token, journal: true, wake: func() { woken.Add(1) }})
	failed := b.insert(t, tenantA, saga.StatusFailed, 1, 0)
	done := b.insert(t, tenantA, saga.StatusCompleted, 3, 0)
	if r := b.do(t, "POST", "/v1/sagas/"+done.String()+"/retry", `{"reason":"x"}`, bearer...); r.status != http.StatusConflict {
		t.Fatalf("retry of a COMPLETED instance: %d", r.status)
	}
	if n := woken.Load(); n != 0 {
		t.Fatalf("a refused retry woke the runners %d times", n)
	}
	if r := b.do(t, "POST", "/v1/sagas/"+failed.String()+"/retry", `{"reason":"fixed"}`, bearer...); r.status != http.StatusOK {
		t.Fatalf("retry: %d %s", r.status, r.body)
	}
	if n := woken.Load(); n != 1 {
		t.Fatalf("a retry woke the runners %d times, want 1", n)
	}
}

// Every key the README documents is in every answer: null or empty when
// there is nothing to say, never absent.
func TestJSONKeysAreNeverOmitted(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	empty := b.do(t, "GET", "/v1/sagas?status=COMPENSATED", "").json(t)
	if items, ok := empty["items"].([]any); !ok || len(items) != 0 {
		t.Errorf("an empty page's items: %v", empty["items"])
	}
	if v, ok := empty["next_cursor"]; !ok || v != nil {
		t.Errorf("next_cursor on the last page: present %v, value %v; want null", ok, v)
	}
	id := b.insert(t, tenantA, saga.StatusRunning, 0, 0)
	page := b.do(t, "GET", "/v1/sagas", "").json(t)
	item := page["items"].([]any)[0].(map[string]any)
	for _, k := range []string{"id", "tenant_id", "saga_name", "saga_version", "status", "current_step", "current_step_name",
		"attempt", "next_attempt_at", "timeout_at", "last_error", "stuck_reason", "stuck_detail", "lease_expires_at", "created_at", "updated_at"} {
		if _, ok := item[k]; !ok {
			t.Errorf("list item lacks %q: %v", k, item)
		}
	}
	show := b.do(t, "GET", "/v1/sagas/"+id.String(), "").json(t)
	for _, k := range []string{"instance", "registered", "steps", "events", "events_truncated"} {
		if _, ok := show[k]; !ok {
			t.Errorf("show lacks %q", k)
		}
	}
	inst := show["instance"].(map[string]any)
	for _, k := range []string{"workspace_id", "correlation_id", "stuck_detail", "current_step_name", "completed_at"} {
		if _, ok := inst[k]; !ok {
			t.Errorf("show's instance lacks %q: %v", k, inst)
		}
	}
}
