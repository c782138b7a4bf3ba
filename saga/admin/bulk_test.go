package admin_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/admin"
	"github.com/compensa/compensa/test/testkit"
)

// failingOrder is a saga whose last step fails for good and whose charge
// compensation fails while refundDown holds: its instances end FAILED,
// standing at the compensation of step 1.
func failingOrder(refundDown *atomic.Bool) saga.Definition {
	return saga.Definition{Name: "order", Version: 1, Triggers: []saga.Trigger{{EventType: "order.placed"}},
		Steps: []saga.Step{
			{Name: "reserve", Do: logEffect("reserve", false), Compensate: logEffect("reserve", true)},
			{Name: "charge", Do: logEffect("charge", false),
				Compensate: func(ctx context.Context, x *saga.StepTx) error {
					if refundDown.Load() {
						return errors.New("refund service unavailable")
					}
					return logEffect("charge", true)(ctx, x)
				},
				CompensationRetry: saga.RetryPolicy{MaxAttempts: 1, Base: time.Millisecond, Jitter: -1}},
			{Name: "ship", Do: func(context.Context, *saga.StepTx) error {
				return saga.Permanent(errors.New("no courier serves this address"))
			}},
		}}
}

// cloneFailed copies the prototype instance (its row, step records and
// journal, as the runner wrote them) n times for tenant, with fresh ids and
// created_at one microsecond apart, and returns the new ids oldest first.
func (l *live) cloneFailed(t *testing.T, proto uuid.UUID, tenant uuid.UUID, n int) []uuid.UUID {
	t.Helper()
	ctx := context.Background()
	tx, err := l.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, q := range []string{
		`CREATE TEMP TABLE clones ON COMMIT DROP AS
		   SELECT gen_random_uuid() AS id, g FROM generate_series(1, $1::int) g WHERE $2::uuid IS NOT NULL AND $3::uuid IS NOT NULL`,
		// Every column of the prototype, whatever later migrations add.
		`INSERT INTO saga_instances
		   WITH p AS MATERIALIZED (SELECT to_jsonb(p) AS j, p.created_at FROM saga_instances p WHERE p.id = $3)
		   SELECT r.* FROM p, clones c, jsonb_populate_record(NULL::saga_instances, p.j || jsonb_build_object(
		     'id', c.id, 'tenant_id', $2::uuid, 'trigger_event_id', gen_random_uuid(),
		     'created_at', p.created_at + c.g * interval '1 microsecond')) r WHERE $1::int > 0`,
		`INSERT INTO saga_steps
		   WITH p AS MATERIALIZED (SELECT to_jsonb(p) AS j FROM saga_steps p WHERE p.saga_instance_id = $3)
		   SELECT r.* FROM p, clones c, jsonb_populate_record(NULL::saga_steps, p.j || jsonb_build_object(
		     'saga_instance_id', c.id)) r WHERE $1::int > 0 AND $2::uuid IS NOT NULL`,
		`INSERT INTO saga_events (instance_id, version, kind, step, payload, created_at)
		   SELECT c.id, e.version, e.kind, e.step, e.payload, e.created_at
		   FROM saga_events e, clones c WHERE e.instance_id = $3 AND $1::int > 0 AND $2::uuid IS NOT NULL
		   ORDER BY c.g, e.version`,
	} {
		if _, err := tx.Exec(ctx, q, n, tenant, proto); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	rows, err := tx.Query(ctx, `SELECT id FROM clones ORDER BY g`)
	if err != nil {
		t.Fatal(err)
	}
	var ids []uuid.UUID
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return ids
}

// fingerprint digests what an operator action may change: every instance's
// row and every journal entry.
func (l *live) fingerprint(t *testing.T) string {
	t.Helper()
	var s string
	err := l.db.Pool.QueryRow(context.Background(), `
		SELECT md5(coalesce((SELECT string_agg(to_jsonb(i)::text, ',' ORDER BY id) FROM saga_instances i), '')) ||
		       md5(coalesce((SELECT string_agg(to_jsonb(e)::text, ',' ORDER BY global_seq) FROM saga_events e), '')) ||
		       md5(coalesce((SELECT string_agg(to_jsonb(st)::text, ',' ORDER BY saga_instance_id, sequence) FROM saga_steps st), ''))`).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestBulkRetryOf5000FailedInstances is the must-show: 5,000 FAILED
// instances; a dry run counts them and changes nothing; real runs of 1,000
// resume each exactly as a single retry does (journals and state compared
// with instances retried one by one); a further identical call finds
// nothing; the runner then compensates each from where it stood.
func TestBulkRetryOf5000FailedInstances(t *testing.T) {
	testkit.SkipShort(t, "retries 5,000 instances")
	t.Parallel()
	const n = 5000
	var refundDown atomic.Bool
	refundDown.Store(true)
	l := setupLive(t, failingOrder(&refundDown))
	ctx := context.Background()

	stop := l.runner(t)
	proto := l.start(t, "order", 1)
	l.waitFor(t, proto, "FAILED", func(i saga.Instance) bool { return i.Status == saga.StatusFailed })
	stop()
	protoVersion := int64(len(l.events(t, proto)))

	tenantC := uuid.MustParse("cccccccc-0000-0000-0000-000000000003")
	began := time.Now()
	bulkIDs := l.cloneFailed(t, proto, tenantC, n)
	t.Logf("cloned %d FAILED instances in %s", n, time.Since(began))
	singleIDs := l.cloneFailed(t, proto, tenantB, 20)
	// Instances the filter must not touch: another saga's FAILED row and
	// a RUNNING one of this saga and tenant.
	other := l.insert(t, row{tenant: tenantC, saga: "refund", version: 1, status: saga.StatusFailed})
	running := l.insert(t, row{tenant: tenantC, saga: "order", version: 1, status: saga.StatusRunning})

	filter := admin.Filter{Saga: "order", Status: saga.StatusFailed, Tenant: uuid.NullUUID{UUID: tenantC, Valid: true}}
	const reason, actor = "payment provider is back", "test:sre"

	// The dry run.
	before := l.fingerprint(t)
	began = time.Now()
	dry, err := l.adm.RetryMatching(ctx, admin.BulkRequest{Filter: filter, Reason: reason, Actor: actor, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if !dry.DryRun || dry.Matched != n || len(dry.Sample) != admin.SampleSize || dry.Outcomes != nil {
		t.Fatalf("dry run: %+v, want %d matched and a sample of %d", dry, n, admin.SampleSize)
	}
	for i, id := range dry.Sample {
		if id != bulkIDs[i] {
			t.Fatalf("sample[%d] = %s, want the %d-th oldest %s", i, id, i, bulkIDs[i])
		}
	}
	t.Logf("dry run in %s", time.Since(began))
	if after := l.fingerprint(t); after != before {
		t.Fatal("the dry run changed the database")
	}
	if _, err := l.adm.RetryMatching(ctx, admin.BulkRequest{Filter: filter, Actor: actor}); !errors.Is(err, saga.ErrInvalid) {
		t.Fatalf("bulk retry without a reason: %v, want ErrInvalid", err)
	}

	// The control group: the same retry, one instance at a time.
	for _, id := range singleIDs {
		if _, err := l.adm.Retry(ctx, id, reason, actor); err != nil {
			t.Fatal(err)
		}
	}

	// Real runs: 1,000 per call by default.
	began = time.Now()
	for call := 1; call <= n/admin.DefaultBulkLimit; call++ {
		res, err := l.adm.RetryMatching(ctx, admin.BulkRequest{Filter: filter, Reason: reason, Actor: actor})
		if err != nil {
			t.Fatal(err)
		}
		wantMatched := int64(n - (call-1)*admin.DefaultBulkLimit)
		if res.DryRun || res.Matched != wantMatched || res.Outcomes[admin.OutcomeRetried] != admin.DefaultBulkLimit ||
			res.Outcomes[admin.OutcomeAlreadyRequested] != 0 || res.Outcomes[admin.OutcomeConflict] != 0 {
			t.Fatalf("call %d: %+v, want matched %d and %d retried", call, res, wantMatched, admin.DefaultBulkLimit)
		}
		var compensating int
		if err := l.db.Pool.QueryRow(ctx, `SELECT count(*) FROM saga_instances WHERE status = 'COMPENSATING' AND tenant_id = $1`, tenantC).Scan(&compensating); err != nil {
			t.Fatal(err)
		}
		if compensating != call*admin.DefaultBulkLimit {
			t.Fatalf("after call %d, %d instances are COMPENSATING, want %d (one batch per call)", call, compensating, call*admin.DefaultBulkLimit)
		}
	}
	t.Logf("%d instances retried in %d calls in %s", n, n/admin.DefaultBulkLimit, time.Since(began))
	again, err := l.adm.RetryMatching(ctx, admin.BulkRequest{Filter: filter, Reason: reason, Actor: actor})
	if err != nil {
		t.Fatal(err)
	}
	if again.Matched != 0 || again.Outcomes[admin.OutcomeRetried] != 0 || again.Outcomes[admin.OutcomeAlreadyRequested] != 0 || again.Outcomes[admin.OutcomeConflict] != 0 {
		t.Fatalf("a second identical call: %+v, want nothing left to do", again)
	}
	for _, id := range []uuid.UUID{other, running} {
		if evs := l.events(t, id); len(evs) != 0 {
			t.Errorf("instance %s outside the filter got journal entries: %v", id, kindsAfter(evs, 0))
		}
	}

	// Each bulk-retried instance stands exactly as a singly retried one:
	// same state, same step records, same journal entries after the
	// prototype's, with the reason and the caller.
	var signatures []string
	rows, err := l.db.Pool.Query(ctx, `
		SELECT DISTINCT concat_ws('|', i.status, i.current_step, i.attempt, i.compensation_reason, i.lease_id IS NULL,
		  i.next_attempt_at <= now(),
		  (SELECT string_agg(concat_ws(':', st.sequence, st.status, st.attempts, st.compensation_attempts), ',' ORDER BY st.sequence)
		     FROM saga_steps st WHERE st.saga_instance_id = i.id),
		  (SELECT string_agg(concat_ws(':', e.version, e.kind, e.step, e.payload::text), ',' ORDER BY e.version)
		     FROM saga_events e WHERE e.instance_id = i.id AND e.version > $2))
		FROM saga_instances i WHERE i.id = ANY($1)`, append(append([]uuid.UUID{}, bulkIDs...), singleIDs...), protoVersion)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		signatures = append(signatures, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(signatures) != 1 {
		t.Fatalf("bulk and single retries left %d different states, want 1:\n%s", len(signatures), strings.Join(signatures, "\n"))
	}
	sig := signatures[0]
	if !strings.HasPrefix(sig, "COMPENSATING|1|0|") || !strings.Contains(sig, `"reason": "`+reason+`"`) || !strings.Contains(sig, `"actor": "`+actor+`"`) ||
		!strings.Contains(sig, string(saga.EventRetryRequested)) {
		t.Fatalf("state after the retry: %s; want COMPENSATING at step 1, attempt 0, a retry_requested entry with the reason and the caller", sig)
	}

}

// TestBulkRetriedInstancesResumeWhereTheyStood: after a bulk retry the
// runner compensates each instance from the compensation that failed,
// then the one below it, and nothing else. (The 5,000-instance test stops
// at the journal: a runner working through 5,000 instances on a loaded
// CI machine under -race takes minutes and proves nothing more.)
func TestBulkRetriedInstancesResumeWhereTheyStood(t *testing.T) {
	t.Parallel()
	const n = 200
	var refundDown atomic.Bool
	refundDown.Store(true)
	l := setupLive(t, failingOrder(&refundDown))
	ctx := context.Background()
	stop := l.runner(t)
	proto := l.start(t, "order", 1)
	l.waitFor(t, proto, "FAILED", func(i saga.Instance) bool { return i.Status == saga.StatusFailed })
	stop()
	tenantC := uuid.MustParse("cccccccc-0000-0000-0000-000000000003")
	ids := l.cloneFailed(t, proto, tenantC, n)

	res, err := l.adm.RetryMatching(ctx, admin.BulkRequest{Filter: admin.Filter{Status: saga.StatusFailed, Tenant: uuid.NullUUID{UUID: tenantC, Valid: true}},
		Reason: "refund service is back", Actor: "test:sre", Limit: 50})
	if err != nil {
		t.Fatal(err)
	}
	if res.Matched != n || res.Outcomes[admin.OutcomeRetried] != 50 {
		t.Fatalf("first call: %+v, want %d matched and 50 retried", res, n)
	}
	for {
		res, err := l.adm.RetryMatching(ctx, admin.BulkRequest{Filter: admin.Filter{Status: saga.StatusFailed, Tenant: uuid.NullUUID{UUID: tenantC, Valid: true}},
			Reason: "refund service is back", Actor: "test:sre", Limit: 50})
		if err != nil {
			t.Fatal(err)
		}
		if res.Matched == 0 {
			break
		}
	}

	refundDown.Store(false)
	l.runner(t)
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var left int
		if err := l.db.Pool.QueryRow(ctx, `SELECT count(*) FROM saga_instances WHERE id = ANY($1) AND status <> 'COMPENSATED'`, ids).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d bulk-retried instances are not COMPENSATED after 3 minutes", left)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var wrong int
	if err := l.db.Pool.QueryRow(ctx, `
		SELECT count(*) FROM unnest($1::uuid[]) AS b(id)
		WHERE (SELECT string_agg(step || ':' || compensation, ',' ORDER BY e.id) FROM effects e WHERE e.instance_id = b.id)
		      IS DISTINCT FROM 'charge:true,reserve:true'`, ids).Scan(&wrong); err != nil {
		t.Fatal(err)
	}
	if wrong != 0 {
		t.Fatalf("%d instances ran other effects than undo charge then undo reserve", wrong)
	}
}
