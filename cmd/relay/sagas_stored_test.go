package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/migrations"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/declare"
	"github.com/compensa/compensa/saga/pgjournal"
	"github.com/compensa/compensa/test/testkit"
)

// TestSagasCLIKnowsStoredDefinitions: a declared saga pinned by some relay
// (its body in saga_definitions) is known to `relay sagas` run without
// --sagas: show names its steps, list --stuck does not call its instances
// unregistered, and retry is accepted for a relay that runs it to carry out.
// An instance of a version neither in the binary nor stored is still
// reported as unregistered.
func TestSagasCLIKnowsStoredDefinitions(t *testing.T) {
	testkit.SkipShort(t, "runs the CLI against stored definitions at length")
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, pool := migratedCluster(ctx, t, migrations.Options{})

	// What a relay run with --sagas stores at start.
	body, err := os.ReadFile(filepath.Join("..", "..", "examples", "orders", "sagas", "order_fulfilment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	s, probs := declare.LoadFile("order_fulfilment.yaml", body, declare.Options{})
	if probs != nil {
		t.Fatal(probs)
	}
	if _, err := declare.Pin(ctx, pool, []*declare.Saga{s}); err != nil {
		t.Fatal(err)
	}

	j, err := pgjournal.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	enqueue := func(version int) uuid.UUID {
		t.Helper()
		id := uuid.New()
		if err := j.Enqueue(ctx, saga.Instance{ID: id, TenantID: uuid.New(), SagaName: s.Name, SagaVersion: version,
			Status: saga.StatusRunning, TriggerEventID: uuid.New(), Context: json.RawMessage(`{"trigger":{},"steps":{}}`)}); err != nil {
			t.Fatal(err)
		}
		return id
	}
	// A declared instance that failed for good at its second step.
	failed := enqueue(s.Version)
	claimed, err := j.ClaimPending(ctx, 1, time.Minute)
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	lease := claimed[0].LeaseID.UUID
	for _, ev := range []saga.Event{
		{Kind: saga.EventStepCompleted, Step: 0, StepName: "reserve_stock"},
		{Kind: saga.EventCompensationStarted, Step: 0, Reason: "card declined"},
		{Kind: saga.EventCompensationFailed, Step: 0, StepName: "reserve_stock", Error: "stock table locked"},
	} {
		if _, err := j.Append(ctx, failed, lease, ev); err != nil {
			t.Fatalf("append %s: %v", ev.Kind, err)
		}
	}
	if ok, err := j.MarkTerminal(ctx, failed, lease, saga.StatusFailed, "stock table locked"); !ok || err != nil {
		t.Fatalf("MarkTerminal: %v %v", ok, err)
	}
	// A version nobody stored: still unregistered.
	orphan := enqueue(s.Version + 41)

	out, err := runSagas(t, c.URL, "sagas", "show", failed.String())
	if err != nil {
		t.Fatalf("show: %v\n%s", err, out)
	}
	for _, want := range []string{"reserve_stock", "charge_payment", "ship", "confirm"} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks the stored definition's step %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "neither in this binary") {
		t.Errorf("show calls a stored definition unknown:\n%s", out)
	}
	out, err = runSagas(t, c.URL, "sagas", "show", orphan.String())
	if err != nil || !strings.Contains(out, "neither in this binary nor stored") {
		t.Errorf("show of a version nobody stored should say so: %v\n%s", err, out)
	}

	out, err = runSagas(t, c.URL, "sagas", "list", "--stuck", "--json")
	if err != nil {
		t.Fatalf("list --stuck: %v\n%s", err, out)
	}
	var page struct {
		Items []struct {
			ID          uuid.UUID `json:"id"`
			StuckReason string    `json:"stuck_reason"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &page); err != nil {
		t.Fatalf("list --stuck --json: %v\n%s", err, out)
	}
	reasons := map[uuid.UUID]string{}
	for _, it := range page.Items {
		reasons[it.ID] = it.StuckReason
	}
	if reasons[failed] != "failed" {
		t.Errorf("the failed declared instance is stuck as %q, want failed\n%s", reasons[failed], out)
	}
	if reasons[orphan] != "unregistered_version" {
		t.Errorf("the instance of an unstored version is stuck as %q, want unregistered_version\n%s", reasons[orphan], out)
	}

	out, err = runSagas(t, c.URL, "sagas", "retry", failed.String(), "--reason", "stock table unlocked", "--yes")
	if err != nil {
		t.Fatalf("retry of a stored declared instance: %v\n%s", err, out)
	}
	var status string
	if err := pool.QueryRow(ctx, `SELECT status FROM saga_instances WHERE id = $1`, failed).Scan(&status); err != nil || status != "COMPENSATING" && status != "RUNNING" {
		t.Errorf("after retry the instance is %q (%v), want it back in the runners' hands", status, err)
	}
	if _, err := runSagas(t, c.URL, "sagas", "retry", orphan.String(), "--reason", "x", "--yes"); err == nil || !strings.Contains(err.Error(), "no relay can run") {
		t.Errorf("retry of an unstored version: %v, want a refusal saying no relay can run it", err)
	}

	// Start by hand, from the stored body: the trigger event is written once
	// per idempotency key.
	payload := filepath.Join(t.TempDir(), "order.json")
	if err := os.WriteFile(payload, []byte(`{"order_id": "o-1", "sku": "A", "qty": 1, "cents": 100}`), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = runSagas(t, c.URL, "sagas", "start", s.Name, "--payload", payload, "--idempotency-key", "o-1", "--aggregate-id", "o-1")
	if err != nil || !strings.Contains(out, "written: trigger event") || !strings.Contains(out, "order.placed") {
		t.Fatalf("sagas start: %v\n%s", err, out)
	}
	out, err = runSagas(t, c.URL, "sagas", "start", s.Name, "--payload", payload, "--idempotency-key", "o-1", "--aggregate-id", "o-1")
	if err != nil || !strings.Contains(out, "already written") {
		t.Fatalf("sagas start with the same key: %v\n%s", err, out)
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE event_type = 'order.placed' AND aggregate_id = 'o-1' AND payload->>'order_id' = 'o-1'`).Scan(&rows); err != nil || rows != 1 {
		t.Errorf("%d trigger rows for one idempotency key (%v), want 1", rows, err)
	}
	if _, err := runSagas(t, c.URL, "sagas", "start", "no_such_saga"); err == nil || !strings.Contains(err.Error(), "no saga \"no_such_saga\" is known") {
		t.Errorf("start of an unknown saga: %v", err)
	}
}

// TestSagasValidateChecksStoredVersions: a saga file changed under the same
// name and version passes `relay sagas validate DIR` offline, but with
// --database-url it is refused as Pin (a start or reload) refuses it: exit
// 2, the file's place and the version to give. A new version passes, and
// nothing is stored by validate.
func TestSagasValidateChecksStoredVersions(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, pool := migratedCluster(ctx, t, migrations.Options{})

	src := filepath.Join("..", "..", "examples", "orders", "sagas", "order_fulfilment.yaml")
	body, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "order_fulfilment.yaml")
	if err := os.WriteFile(file, body, 0o644); err != nil {
		t.Fatal(err)
	}
	loaded, err := declare.LoadDir(dir, declare.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := declare.Pin(ctx, pool, loaded); err != nil {
		t.Fatal(err)
	}
	// The same file validates against what it pinned.
	if out, err := runSagas(t, c.URL, "sagas", "validate", dir); err != nil || !strings.Contains(out, "checked against the stored versions") {
		t.Fatalf("unchanged file: %v\n%s", err, out)
	}

	// The body changes, the version does not.
	changed := strings.Replace(string(body), "deadline: 10m", "deadline: 11m", 1)
	if changed == string(body) {
		t.Fatal("the example has no deadline: 10m line to change")
	}
	if err := os.WriteFile(file, []byte(changed), 0o644); err != nil {
		t.Fatal(err)
	}
	opts := &rootOptions{}
	var stderr bytes.Buffer
	root := newRootCmd(opts)
	root.SetOut(&bytes.Buffer{})
	if code := execute(ctx, root, opts, []string{"sagas", "validate", dir}, &stderr); code != 0 {
		t.Fatalf("offline validate of the changed file: exit %d: %s", code, stderr.String())
	}
	reloaded, reloadErr := declare.LoadDir(dir, declare.Options{})
	if reloadErr != nil {
		t.Fatal(reloadErr)
	}
	_, pinErr := declare.Pin(ctx, pool, reloaded)
	if pinErr == nil {
		t.Fatal("Pin accepted a changed body under the same version")
	}
	out, err := runSagas(t, c.URL, "sagas", "validate", dir)
	var ee exitError
	if !errors.As(err, &ee) || ee.code != 2 {
		t.Fatalf("validate --database-url of the changed file: %v, want exit 2\n%s", err, out)
	}
	for _, line := range strings.Split(pinErr.Error(), "\n") {
		if !strings.Contains(out, line) {
			t.Errorf("validate does not report %q as a reload does:\n%s", line, out)
		}
	}
	if !strings.Contains(out, "order_fulfilment.yaml:") || !strings.Contains(out, "changed since it was first loaded") {
		t.Errorf("output:\n%s", out)
	}

	// A new version passes, and validate stored nothing.
	bumped := strings.Replace(changed, "version: 1", "version: 2", 1)
	if bumped == changed {
		t.Fatal("the example has no version: 1 line")
	}
	if err := os.WriteFile(file, []byte(bumped), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := runSagas(t, c.URL, "sagas", "validate", dir); err != nil {
		t.Fatalf("a new version: %v\n%s", err, out)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM saga_definitions`).Scan(&n); err != nil || n != 1 {
		t.Errorf("saga_definitions holds %d rows (%v), want the 1 Pin stored", n, err)
	}
}
