package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/internal/briefs"
	"github.com/compensa/compensa/migrations"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/pgjournal"
)

// runSagas runs `relay <args>` in process and returns its output.
func runSagas(t *testing.T, url string, args ...string) (string, error) {
	t.Helper()
	opts := &rootOptions{}
	root := newRootCmd(opts)
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append(args, "--database-url", url))
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

// TestSagasCLI runs list, show, retry and cancel against a real database
// with no relay running, as an operator would.
func TestSagasCLI(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, pool := migratedCluster(ctx, t, migrations.Options{WithExamples: true})
	j, err := pgjournal.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}

	// A FAILED brief enrichment: step 0 done, its compensation given up.
	failed := uuid.New()
	start := func(id uuid.UUID) {
		t.Helper()
		if err := j.Enqueue(ctx, saga.Instance{ID: id, TenantID: uuid.New(), SagaName: briefs.SagaName, SagaVersion: briefs.SagaVersion,
			Status: saga.StatusRunning, TriggerEventID: uuid.New(), Context: json.RawMessage(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	start(failed)
	claimed, err := j.ClaimPending(ctx, 1, time.Minute)
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	lease := claimed[0].LeaseID.UUID
	for _, ev := range []saga.Event{
		{Kind: saga.EventStepCompleted, Step: 0, StepName: briefs.StepClaim},
		{Kind: saga.EventCompensationStarted, Step: 0, Reason: "attach failed"},
		{Kind: saga.EventCompensationFailed, Step: 0, StepName: briefs.StepClaim, Error: "briefs table locked"},
	} {
		if _, err := j.Append(ctx, failed, lease, ev); err != nil {
			t.Fatalf("append %s: %v", ev.Kind, err)
		}
	}
	if ok, err := j.MarkTerminal(ctx, failed, lease, saga.StatusFailed, "briefs table locked"); !ok || err != nil {
		t.Fatalf("MarkTerminal: %v %v", ok, err)
	}
	running := uuid.New()
	start(running)

	out, err := runSagas(t, c.URL, "sagas", "list", "--stuck")
	if err != nil {
		t.Fatalf("list --stuck: %v\n%s", err, out)
	}
	if !strings.Contains(out, failed.String()) || strings.Contains(out, running.String()) || !strings.Contains(out, "exhausted its attempts") {
		t.Errorf("list --stuck:\n%s", out)
	}

	out, err = runSagas(t, c.URL, "sagas", "list", "--json", "--limit", "1")
	if err != nil {
		t.Fatal(err)
	}
	var page struct {
		Items []struct {
			ID uuid.UUID `json:"id"`
		} `json:"items"`
		NextCursor *string `json:"next_cursor"`
	}
	if err := json.Unmarshal([]byte(out), &page); err != nil || len(page.Items) != 1 || page.NextCursor == nil {
		t.Fatalf("list --json --limit 1: %v\n%s", err, out)
	}
	out, err = runSagas(t, c.URL, "sagas", "list", "--json", "--limit", "1", "--cursor", *page.NextCursor)
	if err != nil {
		t.Fatal(err)
	}
	first := page.Items[0].ID
	if err := json.Unmarshal([]byte(out), &page); err != nil || len(page.Items) != 1 || page.Items[0].ID == first || page.NextCursor != nil {
		t.Errorf("second page: %v\n%s", err, out)
	}
	// A bad status is refused while the flags are parsed (exit 2).
	var ee exitError
	if _, err := runSagas(t, c.URL, "sagas", "list", "--status", "DONE"); !errors.As(err, &ee) || ee.code != 2 || !strings.Contains(ee.msg, "--status") {
		t.Errorf("list --status DONE: %v, want a usage error naming --status", err)
	}

	out, err = runSagas(t, c.URL, "sagas", "show", failed.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"FAILED", briefs.StepClaim, "compensation_failed", "briefs table locked", "steps:", "journal:"} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks %q:\n%s", want, out)
		}
	}

	if _, err := runSagas(t, c.URL, "sagas", "retry", failed.String()); err == nil || !strings.Contains(err.Error(), "--reason is required") {
		t.Errorf("retry without --reason: %v", err)
	}
	out, err = runSagas(t, c.URL, "sagas", "retry", failed.String(), "--reason", "lock released")
	if err != nil || !strings.Contains(out, "retry requested") || !strings.Contains(out, "COMPENSATING") {
		t.Fatalf("retry: %v\n%s", err, out)
	}
	out, err = runSagas(t, c.URL, "sagas", "retry", failed.String(), "--reason", "again")
	if err != nil || !strings.Contains(out, "already requested") {
		t.Errorf("second retry: %v\n%s", err, out)
	}
	evs, err := j.Load(ctx, failed)
	if err != nil {
		t.Fatal(err)
	}
	last := evs[len(evs)-1]
	if last.Kind != saga.EventRetryRequested || last.Reason != "lock released" || !strings.HasPrefix(last.Actor, "cli:") || len(last.Actor) <= len("cli:") {
		t.Errorf("journaled retry: %s reason %q actor %q", last.Kind, last.Reason, last.Actor)
	}

	out, err = runSagas(t, c.URL, "sagas", "cancel", running.String(), "--reason", "customer withdrew")
	if err != nil || !strings.Contains(out, "cancel requested") {
		t.Errorf("cancel: %v\n%s", err, out)
	}
	if _, err := runSagas(t, c.URL, "sagas", "cancel", failed.String()); !errors.Is(err, saga.ErrConflict) {
		t.Errorf("cancel of a compensating instance: %v, want a conflict", err)
	}
	if _, err := runSagas(t, c.URL, "sagas", "show", "nope"); err == nil || !strings.Contains(err.Error(), "not a saga instance id") {
		t.Errorf("show nope: %v", err)
	}
	if _, err := runSagas(t, c.URL, "sagas", "show", uuid.NewString()); !errors.Is(err, saga.ErrNotFound) {
		t.Errorf("show of an unknown id: %v", err)
	}

	// Bulk: three RUNNING instances of one tenant, cancelled by filter.
	tenant := uuid.New()
	var bulk []uuid.UUID
	for range 3 {
		id := uuid.New()
		if err := j.Enqueue(ctx, saga.Instance{ID: id, TenantID: tenant, SagaName: briefs.SagaName, SagaVersion: briefs.SagaVersion,
			Status: saga.StatusRunning, TriggerEventID: uuid.New(), Context: json.RawMessage(`{}`)}); err != nil {
			t.Fatal(err)
		}
		bulk = append(bulk, id)
	}
	filter := []string{"--filter", "tenant=" + tenant.String(), "--filter", "status=running"}
	if _, err := runSagas(t, c.URL, append([]string{"sagas", "cancel"}, filter...)...); err == nil || !strings.Contains(err.Error(), "--reason is required") {
		t.Errorf("bulk cancel without --reason: %v", err)
	}
	if _, err := runSagas(t, c.URL, "sagas", "cancel", "--filter", "colour=red", "--reason", "x"); err == nil || !strings.Contains(err.Error(), `unknown key "colour"`) {
		t.Errorf("bulk cancel with a bad key: %v", err)
	}
	out, err = runSagas(t, c.URL, append([]string{"sagas", "cancel", "--reason", "tenant offboarded"}, filter...)...)
	if err != nil || !strings.Contains(out, "3 instances match; 3 can be cancelled, 0 would be skipped (a cancel cannot act on them); nothing was changed (dry run)") || !strings.Contains(out, bulk[0].String()) {
		t.Fatalf("bulk cancel dry run: %v\n%s", err, out)
	}
	if evs, _ := j.Load(ctx, bulk[0]); len(evs) != 0 {
		t.Fatalf("the dry run journaled %d events", len(evs))
	}
	out, err = runSagas(t, c.URL, append([]string{"sagas", "cancel", "--reason", "tenant offboarded", "--yes"}, filter...)...)
	if err != nil || !strings.Contains(out, "3 matched, 0 skipped (a cancel cannot act on them): 3 cancelled, 0 already requested, 0 conflict") {
		t.Fatalf("bulk cancel: %v\n%s", err, out)
	}
	for _, id := range bulk {
		evs, err := j.Load(ctx, id)
		if err != nil || len(evs) != 1 || evs[0].Kind != saga.EventCancelRequested || evs[0].Reason != "tenant offboarded" || !strings.HasPrefix(evs[0].Actor, "cli:") {
			t.Errorf("instance %s after the bulk cancel: %+v %v", id, evs, err)
		}
	}
	out, err = runSagas(t, c.URL, append([]string{"sagas", "cancel", "--reason", "tenant offboarded", "--yes"}, filter...)...)
	if err != nil || !strings.Contains(out, "0 matched") {
		t.Errorf("second bulk cancel: %v\n%s", err, out)
	}
	// The same tenant without the status filter: the three are compensating
	// now, which a cancel cannot act on; the dry run says it skips them.
	out, err = runSagas(t, c.URL, "sagas", "cancel", "--reason", "again", "--filter", "tenant="+tenant.String())
	if err != nil || !strings.Contains(out, "3 instances match; 0 can be cancelled, 3 would be skipped") || strings.Contains(out, "--yes") {
		t.Errorf("bulk cancel dry run over compensating instances: %v\n%s", err, out)
	}
}
