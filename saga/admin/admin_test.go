package admin_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/admin"
	"github.com/compensa/compensa/test/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

type testBundle struct {
	db  *pgtest.DB
	reg *saga.Registry
	adm *admin.Admin
}

func noop(context.Context, *saga.StepTx) error { return nil }

func threeSteps(name string, version int) saga.Definition {
	return saga.Definition{Name: name, Version: version,
		Triggers: []saga.Trigger{{EventType: name + ".requested"}},
		Steps: []saga.Step{
			{Name: "reserve", Do: noop, Compensate: noop},
			{Name: "charge", Do: noop, Compensate: noop},
			{Name: "ship", Do: noop, Compensate: noop},
		}}
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	b := &testBundle{db: pgtest.NewDB(t), reg: saga.NewRegistry()}
	b.reg.MustRegister(threeSteps("order", 1), threeSteps("order", 2))
	var err error
	b.adm, err = admin.New(admin.Config{Pool: b.db.Pool, Registry: b.reg})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// row describes an instance to insert. Offsets are relative to the
// database's now(); a nil lease offset means no lease.
type row struct {
	tenant     uuid.UUID
	saga       string
	version    int
	status     saga.Status
	step       int
	attempt    int
	nextIn     time.Duration
	leaseIn    *time.Duration
	lastError  string
	createdAgo time.Duration
}

func dur(d time.Duration) *time.Duration { return &d }

var tenantA = uuid.MustParse("aaaaaaaa-0000-0000-0000-000000000001")
var tenantB = uuid.MustParse("bbbbbbbb-0000-0000-0000-000000000002")

func (b *testBundle) insert(t *testing.T, r row) uuid.UUID {
	t.Helper()
	if r.saga == "" {
		r.saga = "order"
	}
	if r.version == 0 {
		r.version = 1
	}
	if r.tenant == uuid.Nil {
		r.tenant = tenantA
	}
	if r.status == "" {
		r.status = saga.StatusRunning
	}
	id := uuid.New()
	var leaseID *uuid.UUID
	var leaseIn *string
	if r.leaseIn != nil {
		l := uuid.New()
		leaseID = &l
		s := fmt.Sprintf("%d microseconds", r.leaseIn.Microseconds())
		leaseIn = &s
	}
	var lastErr *string
	if r.lastError != "" {
		lastErr = &r.lastError
	}
	_, err := b.db.Pool.Exec(context.Background(), `
INSERT INTO saga_instances (id, tenant_id, saga_name, saga_version, status, current_step, trigger_event_id,
  attempt, next_attempt_at, lease_id, lease_expires_at, last_error, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5::saga_status, $6, gen_random_uuid(), $7,
  now() + $8::bigint * interval '1 microsecond', $9, now() + $10::interval, $11,
  now() - $12::bigint * interval '1 microsecond', now())`,
		id, r.tenant, r.saga, r.version, string(r.status), r.step, r.attempt,
		r.nextIn.Microseconds(), leaseID, leaseIn, lastErr, r.createdAgo.Microseconds())
	if err != nil {
		t.Fatalf("insert instance: %v", err)
	}
	return id
}

func (b *testBundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := b.db.Pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func reasons(t *testing.T, p admin.Page) map[uuid.UUID]string {
	t.Helper()
	out := map[uuid.UUID]string{}
	for _, it := range p.Items {
		out[it.ID] = it.StuckReason
	}
	return out
}

func TestStuckClassification(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cases := []struct {
		name string
		row  row
		want string
	}{
		{"failed", row{status: saga.StatusFailed, step: 1, lastError: "refund refused"}, admin.StuckFailed},
		{"running overdue, no lease", row{nextIn: -10 * time.Minute}, admin.StuckOverdue},
		{"compensating overdue, expired lease", row{status: saga.StatusCompensating, nextIn: -10 * time.Minute, leaseIn: dur(-time.Minute)}, admin.StuckOverdue},
		{"running overdue but leased", row{nextIn: -10 * time.Minute, leaseIn: dur(time.Minute)}, ""},
		{"running due recently", row{nextIn: -time.Minute}, ""},
		{"running backing off", row{nextIn: time.Hour}, ""},
		{"completed", row{status: saga.StatusCompleted, step: 3, nextIn: -time.Hour}, ""},
		{"unregistered version running", row{version: 9}, admin.StuckUnregistered},
		{"unregistered version failed", row{version: 9, status: saga.StatusFailed}, admin.StuckUnregistered},
		{"unregistered saga compensated", row{saga: "gone", status: saga.StatusCompensated, step: -1}, ""},
	}
	ids := map[uuid.UUID]int{}
	for i, c := range cases {
		ids[b.insert(t, c.row)] = i
	}
	page, err := b.adm.List(ctx, admin.Filter{Limit: admin.MaxLimit})
	if err != nil {
		t.Fatal(err)
	}
	got := reasons(t, page)
	for id, i := range ids {
		if got[id] != cases[i].want {
			t.Errorf("%s: stuck_reason %q, want %q", cases[i].name, got[id], cases[i].want)
		}
	}
	for _, it := range page.Items {
		if (it.StuckReason == "") != (it.StuckDetail == "") {
			t.Errorf("%s: stuck_reason %q with detail %q", it.ID, it.StuckReason, it.StuckDetail)
		}
	}

	stuck, err := b.adm.List(ctx, admin.Filter{Stuck: true, Limit: admin.MaxLimit})
	if err != nil {
		t.Fatal(err)
	}
	wantStuck := 0
	for _, c := range cases {
		if c.want != "" {
			wantStuck++
		}
	}
	if len(stuck.Items) != wantStuck {
		t.Fatalf("stuck=true listed %d instances, want %d", len(stuck.Items), wantStuck)
	}
	for _, it := range stuck.Items {
		if want := cases[ids[it.ID]].want; it.StuckReason != want || want == "" {
			t.Errorf("stuck list: %s has reason %q, want %q", cases[ids[it.ID]].name, it.StuckReason, want)
		}
	}

	counts, err := b.adm.StuckCounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	total := map[string]int64{}
	for _, c := range counts {
		total[c.Reason] += c.Count
	}
	if total[admin.StuckFailed] != 1 || total[admin.StuckOverdue] != 2 || total[admin.StuckUnregistered] != 2 {
		t.Errorf("StuckCounts = %+v", counts)
	}

	// Without a registry nothing is called unregistered: a CLI that does
	// not know the definitions must not cry wolf.
	blind, err := admin.New(admin.Config{Pool: b.db.Pool})
	if err != nil {
		t.Fatal(err)
	}
	page, err = blind.List(ctx, admin.Filter{Limit: admin.MaxLimit})
	if err != nil {
		t.Fatal(err)
	}
	for id, r := range reasons(t, page) {
		if r == admin.StuckUnregistered {
			t.Errorf("%s: unregistered without a registry", cases[ids[id]].name)
		}
	}

	// A shorter StuckAfter makes the recently due instance stuck too.
	eager, err := admin.New(admin.Config{Pool: b.db.Pool, Registry: b.reg, StuckAfter: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	page, err = eager.List(ctx, admin.Filter{Stuck: true, Limit: admin.MaxLimit})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Items) != wantStuck+1 {
		t.Errorf("StuckAfter 30s: %d stuck, want %d", len(page.Items), wantStuck+1)
	}
}

func TestListFilters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	a1 := b.insert(t, row{tenant: tenantA, status: saga.StatusFailed})
	a2 := b.insert(t, row{tenant: tenantA, saga: "payment"})
	b1 := b.insert(t, row{tenant: tenantB, status: saga.StatusFailed})

	check := func(name string, ad *admin.Admin, f admin.Filter, want ...uuid.UUID) {
		t.Helper()
		p, err := ad.List(ctx, f)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got := map[uuid.UUID]bool{}
		for _, it := range p.Items {
			got[it.ID] = true
		}
		if len(got) != len(want) {
			t.Errorf("%s: got %d items, want %d", name, len(got), len(want))
		}
		for _, id := range want {
			if !got[id] {
				t.Errorf("%s: %s missing", name, id)
			}
		}
	}
	check("all", b.adm, admin.Filter{}, a1, a2, b1)
	check("status lower case", b.adm, admin.Filter{Status: "failed"}, a1, b1)
	check("saga", b.adm, admin.Filter{Saga: "payment"}, a2)
	check("tenant", b.adm, admin.Filter{Tenant: uuid.NullUUID{UUID: tenantB, Valid: true}}, b1)
	check("scope", b.adm.ForTenant(tenantA), admin.Filter{}, a1, a2)
	check("scope and other tenant", b.adm.ForTenant(tenantA), admin.Filter{Tenant: uuid.NullUUID{UUID: tenantB, Valid: true}})
	check("scope stuck", b.adm.ForTenant(tenantB), admin.Filter{Stuck: true}, b1)

	for name, f := range map[string]admin.Filter{
		"bad status":      {Status: "DONE"},
		"negative limit":  {Limit: -1},
		"limit too large": {Limit: admin.MaxLimit + 1},
		"garbage cursor":  {Cursor: "not a cursor!"},
		"empty cursor id": {Cursor: "e30"}, // base64url of {}
	} {
		if _, err := b.adm.List(ctx, f); !errors.Is(err, saga.ErrInvalid) {
			t.Errorf("%s: err %v, want ErrInvalid", name, err)
		}
	}

	// A cursor is bound to its filters.
	p, err := b.adm.List(ctx, admin.Filter{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if p.NextCursor == "" {
		t.Fatal("a page of 1 out of 3 has no next cursor")
	}
	if _, err := b.adm.List(ctx, admin.Filter{Limit: 1, Status: saga.StatusFailed, Cursor: p.NextCursor}); !errors.Is(err, saga.ErrInvalid) {
		t.Errorf("cursor reused with other filters: err %v, want ErrInvalid", err)
	}
	if _, err := b.adm.ForTenant(tenantA).List(ctx, admin.Filter{Limit: 1, Cursor: p.NextCursor}); !errors.Is(err, saga.ErrInvalid) {
		t.Errorf("cursor reused under another scope: err %v, want ErrInvalid", err)
	}
	if _, err := b.adm.List(ctx, admin.Filter{Limit: 2, Cursor: p.NextCursor}); err != nil {
		t.Errorf("cursor reused with another limit: %v", err)
	}
}

// TestPaginationStableUnderInserts pages through instances, a few per page,
// while other instances are inserted as fast as possible: every instance
// that existed before the first page is seen exactly once, and nothing is
// seen twice. Many rows share one created_at (one INSERT statement), so the
// id half of the keyset is exercised too.
func TestPaginationStableUnderInserts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	// 300 rows in 3 statements: 100 rows per created_at value.
	for range 3 {
		b.exec(t, `INSERT INTO saga_instances (tenant_id, saga_name, saga_version, trigger_event_id, created_at)
SELECT $1, 'order', 1, gen_random_uuid(), now() - interval '1 hour' FROM generate_series(1, 100)`, tenantA)
		time.Sleep(2 * time.Millisecond)
	}
	before := map[uuid.UUID]bool{}
	rows, err := b.db.Pool.Query(ctx, `SELECT id FROM saga_instances`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		before[id] = true
	}
	if rows.Err() != nil || len(before) != 300 {
		t.Fatalf("setup: %d rows, %v", len(before), rows.Err())
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var inserted int
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			// New rows land both at "now" and among the old rows' times:
			// a transaction that started earlier commits with an older
			// created_at.
			_, err := b.db.Pool.Exec(ctx, `INSERT INTO saga_instances (tenant_id, saga_name, saga_version, trigger_event_id, created_at)
VALUES ($1, 'order', 1, gen_random_uuid(), now()), ($1, 'order', 1, gen_random_uuid(), now() - interval '1 hour')`, tenantA)
			if err != nil {
				t.Errorf("concurrent insert: %v", err)
				return
			}
			inserted += 2
		}
	}()

	seen := map[uuid.UUID]int{}
	cursor := ""
	pages := 0
	for {
		p, err := b.adm.List(ctx, admin.Filter{Limit: 7, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, it := range p.Items {
			seen[it.ID]++
		}
		if p.NextCursor == "" {
			break
		}
		cursor = p.NextCursor
	}
	close(stop)
	wg.Wait()

	for id, n := range seen {
		if n > 1 {
			t.Errorf("%s seen %d times", id, n)
		}
	}
	missing := 0
	for id := range before {
		if seen[id] != 1 {
			missing++
		}
	}
	if missing > 0 {
		t.Errorf("%d of the %d rows that existed before paging were not seen", missing, len(before))
	}
	if inserted == 0 {
		t.Fatal("no row was inserted while paging: the test proved nothing")
	}
	t.Logf("%d pages, %d rows inserted while paging", pages, inserted)
}

func TestShow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	id := b.insert(t, row{status: saga.StatusFailed, step: 1, lastError: "refund refused"})
	b.exec(t, `INSERT INTO saga_steps (saga_instance_id, step_name, sequence, status, attempts, compensation_attempts, output, last_error)
VALUES ($1, 'reserve', 0, 'COMPLETED', 1, 0, '{"hold":"h1"}', NULL),
       ($1, 'charge', 1, 'COMPLETED', 2, 5, NULL, 'refund refused')`, id)
	b.exec(t, `INSERT INTO saga_events (instance_id, version, kind, step, payload) VALUES
($1, 1, 'step_completed', 0, '{"kind":"step_completed","step":0}'),
($1, 2, 'step_completed', 1, '{"kind":"step_completed","step":1}'),
($1, 3, 'compensation_started', 1, '{"kind":"compensation_started","step":1,"reason":"ship refused"}'),
($1, 4, 'failed', NULL, '{"kind":"failed","step":-1}')`, id)

	d, err := b.adm.Show(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if d.Instance.Status != saga.StatusFailed || d.Instance.StuckReason != admin.StuckFailed || d.Instance.CurrentStepName != "charge" {
		t.Errorf("instance = %+v", d.Instance.Item)
	}
	if !d.Registered || len(d.Steps) != 3 {
		t.Fatalf("registered %v, %d steps, want the definition's 3", d.Registered, len(d.Steps))
	}
	if s := d.Steps[1]; !s.Recorded || s.CompensationAttempts != 5 || s.LastError != "refund refused" {
		t.Errorf("step 1 = %+v", s)
	}
	if s := d.Steps[2]; s.Recorded || s.Name != "ship" || s.Status != saga.StepPending {
		t.Errorf("step 2 (not reached) = %+v", s)
	}
	if string(d.Steps[0].Output) != `{"hold": "h1"}` {
		t.Errorf("step 0 output = %s", d.Steps[0].Output)
	}
	if len(d.Events) != 4 || d.Events[0].Version != 1 || d.Events[3].Kind != saga.EventFailed || d.Events[3].Step != nil {
		t.Errorf("events = %+v", d.Events)
	}

	if _, err := b.adm.Show(ctx, uuid.New()); !errors.Is(err, saga.ErrNotFound) {
		t.Errorf("unknown id: %v, want ErrNotFound", err)
	}
	if _, err := b.adm.ForTenant(tenantB).Show(ctx, id); !errors.Is(err, saga.ErrNotFound) {
		t.Errorf("other tenant: %v, want ErrNotFound", err)
	}
	if _, err := b.adm.ForTenant(tenantA).Show(ctx, id); err != nil {
		t.Errorf("own tenant: %v", err)
	}
}

func TestParkedEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(t, `INSERT INTO relay_dead_letters (event_id, lsn, reason, raw, retried_at) VALUES
('e1', '0/10', 'bad payload', '{}', NULL), ('e2', '0/20', 'bad payload', '{}', NULL), ('e3', '0/30', 'x', '{}', now())`)
	n, err := b.adm.ParkedEvents(context.Background())
	if err != nil || n != 2 {
		t.Fatalf("ParkedEvents = %d, %v; want 2", n, err)
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	if _, err := admin.New(admin.Config{}); !errors.Is(err, saga.ErrInvalid) {
		t.Errorf("nil pool: %v", err)
	}
	b := setup(t)
	if _, err := admin.New(admin.Config{Pool: b.db.Pool, StuckAfter: -time.Second}); !errors.Is(err, saga.ErrInvalid) {
		t.Errorf("negative StuckAfter: %v", err)
	}
	if _, err := b.adm.Retry(context.Background(), uuid.New(), "why", "me"); !errors.Is(err, admin.ErrReadOnly) {
		t.Errorf("Retry without a journal: %v, want ErrReadOnly", err)
	}
}

// A registered saga with nothing stuck reports 0 for each reason rather than
// vanishing from compensa_sagas_stuck.
func TestStuckCountsReportZeroForEveryRegisteredSaga(t *testing.T) {
	t.Parallel()
	b := setup(t)
	counts, err := b.adm.StuckCounts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, c := range counts {
		got[c.Saga+"/"+c.Reason] = c.Count + 1 // +1: present
	}
	for _, reason := range []string{admin.StuckFailed, admin.StuckHeld, admin.StuckOverdue, admin.StuckUnregistered} {
		if got["order/"+reason] != 1 {
			t.Errorf("order/%s: %v; want a 0 line (got %+v)", reason, got["order/"+reason]-1, counts)
		}
	}
	if len(counts) != 4 {
		t.Errorf("one line per registered saga and reason, got %+v", counts)
	}
}
