package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/correlator"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/saga/pgjournal"
)

// claimScenario measures whether a backlog makes the runner's claim or the
// correlator's start slower: with 1,000 and then 1,000,000 due instances
// (RUNNING, next_attempt_at in the past, no lease), the median time of a
// claim of 8 instances (an idle runner's batch with 8 workers), and of the correlator's transaction
// starting 1,000 more. A flat cost is the promise; a cost that grows with
// the backlog feeds the backlog.
func (r *run) claimScenario(ctx context.Context) error {
	e := r.env
	if err := e.reset(ctx); err != nil {
		return err
	}
	reg := benchRegistry(nil)
	journal, err := pgjournal.New(e.pool, nil)
	if err != nil {
		return err
	}
	corr, err := correlator.New(e.pool, &correlator.Config{Registry: reg, DisableNotify: true})
	if err != nil {
		return err
	}
	tenant := uuid.MustParse(benchTenant)
	have := 0
	var lsn pglogrepl.LSN = 0x20000000
	for _, size := range r.sz.claimSizes {
		r.progress("claim: filling the backlog to %d due instances", size)
		for have < size {
			k := min(100000, size-have)
			if _, err := e.pool.Exec(ctx, sqlDueBacklog, k, benchSaga, tenant); err != nil {
				return fmt.Errorf("claim: fill the backlog: %w", err)
			}
			have += k
		}
		if _, err := e.pool.Exec(ctx, `VACUUM ANALYZE saga_instances`); err != nil {
			return err
		}
		e.checkpoint(ctx)
		claims, err := measureClaims(ctx, journal, fmt.Sprintf("a backlog of %d", size))
		if err != nil {
			return err
		}
		starts := make([]float64, 0, 5)
		for range 5 {
			evs := make([]outbox.Event, 1000)
			for j := range evs {
				evs[j] = outbox.Event{ID: uuid.New(), TenantID: tenant, AggregateType: "order", AggregateID: fmt.Sprint(j),
					EventType: benchEventType, Payload: fmt.Appendf(nil, `{"seq": %d, "currency": "EUR", "amount_cents": 4200}`, j)}
			}
			lsn += 0x1000
			began := time.Now()
			if err := corr.HandleBatch(ctx, cdc.Batch{Slot: e.slotName("claim"), Events: evs, CommitLSN: lsn, EndLSN: lsn + 0x10, CommitTime: time.Now()}); err != nil {
				return fmt.Errorf("claim: correlator start: %w", err)
			}
			starts = append(starts, ms(time.Since(began)))
			have += len(evs)
		}
		c := ClaimCase{Due: size, Tenants: 1, ClaimMs: median(claims), StartMs: median(starts)}
		r.progress("claim: %d due: claim of 8 %.2f ms, correlator start of 1,000 %.1f ms (medians)", size, c.ClaimMs, c.StartMs)
		r.report.Claim = append(r.report.Claim, c)
	}
	return r.claimTenants(ctx, journal)
}

// claimTenants measures the claim shared between tenants: the same
// backlogs spread over claimTenantCount tenants, where every claim first
// looks for the tenants with due work.
func (r *run) claimTenants(ctx context.Context, journal *pgjournal.Journal) error {
	e := r.env
	if _, err := e.pool.Exec(ctx, `TRUNCATE saga_instances CASCADE`); err != nil {
		return err
	}
	have := 0
	for _, size := range r.sz.claimSizes {
		r.progress("claim: filling the backlog to %d due instances over %d tenants", size, claimTenantCount)
		for have < size {
			k := min(100000, size-have)
			if _, err := e.pool.Exec(ctx, sqlDueBacklogTenants, k, benchSaga, claimTenantCount, have); err != nil {
				return fmt.Errorf("claim: fill the backlog: %w", err)
			}
			have += k
		}
		if _, err := e.pool.Exec(ctx, `VACUUM ANALYZE saga_instances`); err != nil {
			return err
		}
		e.checkpoint(ctx)
		claims, err := measureClaims(ctx, journal, fmt.Sprintf("a backlog of %d over %d tenants", size, claimTenantCount))
		if err != nil {
			return err
		}
		c := ClaimCase{Due: size, Tenants: claimTenantCount, ClaimMs: median(claims)}
		r.progress("claim: %d due over %d tenants: claim of 8 %.2f ms (median)", size, claimTenantCount, c.ClaimMs)
		r.report.ClaimTenants = append(r.report.ClaimTenants, c)
	}
	return nil
}

// measureClaims times 25 claims of 8 instances from a backlog (what names
// it in an error), in milliseconds.
func measureClaims(ctx context.Context, journal *pgjournal.Journal, what string) ([]float64, error) {
	const rounds = 25
	claims := make([]float64, 0, rounds)
	for range rounds {
		began := time.Now()
		insts, err := journal.ClaimPending(ctx, 8, time.Minute)
		if err != nil {
			return nil, fmt.Errorf("claim: %w", err)
		}
		if len(insts) != 8 {
			return nil, fmt.Errorf("claim: %d instances claimed from %s, want 8", len(insts), what)
		}
		claims = append(claims, ms(time.Since(began)))
	}
	return claims, nil
}

// claimTenantCount is how many tenants the shared claim's backlog spans.
const claimTenantCount = 1000

// sqlDueBacklogTenants is sqlDueBacklog over $3 tenants (row $4 + g goes to
// tenant (row mod $3)).
const sqlDueBacklogTenants = `
INSERT INTO saga_instances (tenant_id, saga_name, saga_version, trigger_event_id, next_attempt_at)
SELECT md5('tenant ' || (($4::int + g) % $3::int))::uuid, $2, 1, gen_random_uuid(), now() - interval '1 hour' + g * interval '1 microsecond'
FROM generate_series(1, $1::int) g`

// sqlDueBacklog inserts $1 due RUNNING instances of saga $2 (no lease,
// next_attempt_at spread over the past hour), as a backlog of started sagas
// leaves them.
const sqlDueBacklog = `
INSERT INTO saga_instances (tenant_id, saga_name, saga_version, trigger_event_id, next_attempt_at)
SELECT $3, $2, 1, gen_random_uuid(), now() - interval '1 hour' + g * interval '1 microsecond'
FROM generate_series(1, $1::int) g`
