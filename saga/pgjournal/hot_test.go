package pgjournal_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/correlator"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/saga"
)

// Instances started together are neighbours on their pages, so a claim
// leases a page's worth of them in one statement. Its updates are HOT (a new
// row version on the same page, no new entry in each index) only if the
// page has room for the new versions before the versions they replace can
// be pruned.
func TestClaimOfInstancesStartedTogetherIsHOT(t *testing.T) {
	t.Parallel()
	b := setup(t)
	reg := saga.NewRegistry()
	noop := func(context.Context, *saga.StepTx) error { return nil }
	reg.MustRegister(saga.Definition{Name: "hot", Version: 1, Triggers: []saga.Trigger{{EventType: "hot.started"}},
		Steps: []saga.Step{{Name: "one", Do: noop}, {Name: "two", Do: noop}, {Name: "three", Do: noop}}})
	corr, err := correlator.New(b.db.Pool, &correlator.Config{Registry: reg, DisableNotify: true})
	if err != nil {
		t.Fatal(err)
	}
	const n = 64
	tenant := uuid.New()
	evs := make([]outbox.Event, n)
	for i := range evs {
		evs[i] = outbox.Event{ID: uuid.New(), TenantID: tenant, AggregateType: "order", AggregateID: fmt.Sprint(i),
			EventType: "hot.started", Payload: fmt.Appendf(nil, `{"seq": %d, "currency": "EUR", "amount_cents": 4200}`, i), LSN: 0x1000}
	}
	var lsn pglogrepl.LSN = 0x1000
	if err := corr.HandleBatch(ctx, cdc.Batch{Slot: "hot", Events: evs, CommitLSN: lsn, EndLSN: lsn + 0x10, CommitTime: time.Now()}); err != nil {
		t.Fatal(err)
	}

	// updates runs fn in a transaction and returns how many of its updates
	// of saga_instances were HOT, and how many there were.
	updates := func(fn func(ctx context.Context) error) (hot, all int64) {
		t.Helper()
		// The counts are the backend's since its statistics were last
		// reported: read before and after, in the transaction.
		const counts = `SELECT pg_stat_get_xact_tuples_hot_updated('saga_instances'::regclass),
			pg_stat_get_xact_tuples_updated('saga_instances'::regclass)`
		err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			var hot0, all0 int64
			if err := tx.QueryRow(ctx, counts).Scan(&hot0, &all0); err != nil {
				return err
			}
			if err := fn(saga.ContextWithTx(ctx, tx)); err != nil {
				return err
			}
			err := tx.QueryRow(ctx, counts).Scan(&hot, &all)
			hot, all = hot-hot0, all-all0
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return hot, all
	}
	var claimed []saga.Instance
	hot, all := updates(func(ctx context.Context) (err error) {
		claimed, err = b.j.ClaimPending(ctx, n, time.Minute)
		return err
	})
	if all != n || len(claimed) != n {
		t.Fatalf("the claim updated %d rows and returned %d instances, want %d", all, len(claimed), n)
	}
	// Pages filled to 70 % gave about half (30 of 64); a new version is
	// longer than the row it replaces (the lease), so a few may not fit.
	if hot*10 < all*9 {
		t.Errorf("the claim of %d instances started together: %d of its %d updates were HOT, want at least 90 %%", n, hot, all)
	}
}
