package admin_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/admin"
	"github.com/compensa/compensa/test/sagamix"
)

// TestItemsSayHowTheyEnded: the list's step column and reason, for each
// state of the mixed set, written through the real journal.
func TestItemsSayHowTheyEnded(t *testing.T) {
	t.Parallel()
	l := setupLive(t, sagamix.Definition())
	ctx := context.Background()
	set := sagamix.Write(t, l.journal, tenantA)

	page, err := l.adm.List(ctx, admin.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[uuid.UUID]admin.Item{}
	for _, it := range page.Items {
		got[it.ID] = it
	}
	want := []struct {
		id      uuid.UUID
		status  saga.Status
		summary string
		reason  string
	}{
		{set.Completed, saga.StatusCompleted, "completed 4/4", ""},
		{set.Compensated, saga.StatusCompensated, "compensated after score_brief", sagamix.CompensatedReason},
		{set.Failed, saga.StatusFailed, "compensation of reserve failed", sagamix.FailedError},
		{set.Waiting, saga.StatusRunning, "charge · waiting for a reply", ""},
		{set.Running, saga.StatusRunning, "charge", sagamix.RunningError},
	}
	for _, w := range want {
		it, ok := got[w.id]
		if !ok {
			t.Fatalf("%s not listed", w.id)
		}
		if it.Status != w.status || it.StepSummary != w.summary || it.Reason != w.reason {
			t.Errorf("%s: status %s, step %q, reason %q; want %s, %q, %q", w.id, it.Status, it.StepSummary, it.Reason, w.status, w.summary, w.reason)
		}
		if it.Terminal() != (w.status == saga.StatusCompleted || w.status == saga.StatusCompensated) {
			t.Errorf("%s: Terminal() = %t", w.id, it.Terminal())
		}
	}
	if !got[set.Waiting].AwaitingReply || got[set.Running].AwaitingReply {
		t.Errorf("awaiting_reply: waiting %t, running %t", got[set.Waiting].AwaitingReply, got[set.Running].AwaitingReply)
	}

	// Show says the same as the list.
	d, err := l.adm.Show(ctx, set.Compensated)
	if err != nil {
		t.Fatal(err)
	}
	if d.Instance.StepSummary != "compensated after score_brief" {
		t.Errorf("Show: step %q", d.Instance.StepSummary)
	}

	// Without the definition the recorded step names tell the same.
	blind, err := admin.New(admin.Config{Pool: l.db.Pool})
	if err != nil {
		t.Fatal(err)
	}
	bp, err := blind.List(ctx, admin.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range bp.Items {
		if it.StepSummary != got[it.ID].StepSummary {
			t.Errorf("without a registry %s says %q, with it %q", it.ID, it.StepSummary, got[it.ID].StepSummary)
		}
	}
}

// TestSearchByIDSuffix: the end of an id (8 or more hex characters, the 12
// the list shows) finds its instance; an end shared by two instances is an
// error that says to give more.
func TestSearchByIDSuffix(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	id := b.insert(t, row{})
	s := strings.ReplaceAll(id.String(), "-", "")
	for _, q := range []string{s[20:], s[24:], strings.ToUpper(s[22:]), id.String()[14:]} {
		hits, err := b.adm.Search(ctx, q)
		if err != nil {
			t.Fatalf("search %q: %v", q, err)
		}
		if len(hits) != 1 || hits[0].ID != id {
			t.Fatalf("search %q: %+v", q, hits)
		}
		if q != id.String()[14:] && hits[0].MatchedBy != "instance_id_suffix" {
			t.Errorf("search %q matched by %q", q, hits[0].MatchedBy)
		}
	}
	if hits, err := b.adm.Search(ctx, s[25:]); err != nil || len(hits) != 0 {
		t.Errorf("7 characters are not looked up as an id's end: %v %v", hits, err)
	}
	// Two ids with the same last 8 characters.
	twin := uuid.MustParse("0190aaaa-0000-7000-8000-0000" + s[24:])
	other := uuid.MustParse("0190bbbb-0000-7000-8000-0000" + s[24:])
	for _, x := range []uuid.UUID{twin, other} {
		b.exec(t, `INSERT INTO saga_instances (id, tenant_id, saga_name, saga_version, status, trigger_event_id)
			VALUES ($1, $2, 'order', 1, 'RUNNING', gen_random_uuid())`, x, tenantA)
	}
	_, err := b.adm.Search(ctx, s[24:])
	if !errors.Is(err, saga.ErrInvalid) || !strings.Contains(err.Error(), "more than one instance") {
		t.Fatalf("ambiguous end: %v", err)
	}
	if hits, err := b.adm.Search(ctx, s[20:]); err != nil || len(hits) != 1 || hits[0].ID != id {
		t.Fatalf("a longer end tells them apart: %v %v", hits, err)
	}
}

// TestBulkCountsOnlyWhatItCanActOn: over the mixed set, a retry applies to
// the failed and the running instances, a cancel to the running ones; the
// dry run says how many of the filter's matches each skips, and a real run
// touches only what applies (no conflicts).
func TestBulkCountsOnlyWhatItCanActOn(t *testing.T) {
	t.Parallel()
	l := setupLive(t, sagamix.Definition())
	ctx := context.Background()
	set := sagamix.Write(t, l.journal, tenantA)
	// The running ones hold the lease Write claimed them with: let it go,
	// as a runner that stopped would.
	l.exec(t, `UPDATE saga_instances SET lease_id = NULL, lease_expires_at = NULL WHERE id = ANY($1)`, []uuid.UUID{set.Running, set.Waiting})

	req := admin.BulkRequest{Filter: admin.Filter{Saga: "order"}, Reason: "test", Actor: "t", DryRun: true}
	retry, err := l.adm.RetryMatching(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if retry.Matched != 5 || retry.Applicable != 3 || retry.Skipped != 2 || len(retry.Sample) != 3 {
		t.Errorf("retry dry run: %+v; want 5 matched, 3 applicable (failed, running, waiting), 2 skipped", retry)
	}
	cancel, err := l.adm.CancelMatching(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if cancel.Matched != 5 || cancel.Applicable != 2 || cancel.Skipped != 3 {
		t.Errorf("cancel dry run: %+v; want 5 matched, 2 applicable, 3 skipped", cancel)
	}
	for action, want := range map[string]int64{admin.ActionRetry: 3, admin.ActionCancel: 2} {
		n, more, err := l.adm.CountApplicable(ctx, admin.Filter{Saga: "order"}, action, 100)
		if err != nil || n != want || more {
			t.Errorf("CountApplicable(%s) = %d %t %v, want %d", action, n, more, err, want)
		}
	}
	onlyDone := admin.Filter{Status: saga.StatusCompensated}
	if n, _, err := l.adm.CountApplicable(ctx, onlyDone, admin.ActionRetry, 100); err != nil || n != 0 {
		t.Errorf("retry of COMPENSATED instances applies to %d (%v), want 0", n, err)
	}

	req.DryRun = false
	res, err := l.adm.CancelMatching(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcomes[admin.OutcomeCancelled] != 2 || res.Outcomes[admin.OutcomeConflict] != 0 || res.Skipped != 3 {
		t.Errorf("cancel: %+v; want 2 cancelled, no conflict, 3 skipped", res)
	}
}
