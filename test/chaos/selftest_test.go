//go:build chaos

package chaos

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/internal/briefs"
	"github.com/compensa/compensa/test/pgtest"
)

// scenarioSelfTest plants each fault the checkers look for in a database of
// its own, without any relay, and checks that each checker reports it: a
// checker that cannot fail proves nothing.
func scenarioSelfTest(t *testing.T, r *report) {
	db := pgtest.NewDB(t)
	tg := fromPgtest(db)
	installAudit(t, tg)
	ctx := context.Background()
	exec := func(tx pgx.Tx, sql string, args ...any) {
		t.Helper()
		if _, err := tx.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	inTx := func(app string, f func(tx pgx.Tx)) {
		t.Helper()
		tx, err := tg.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		exec(tx, `SELECT set_config('application_name', $1, true)`, app)
		f(tx)
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	newBrief := func(title string) (brief, trigger uuid.UUID) {
		inTx("producer", func(tx pgx.Tx) {
			var err error
			if brief, err = briefs.Create(ctx, tx, tenants[0], title, "body"); err != nil {
				t.Fatal(err)
			}
			if err := tx.QueryRow(ctx, `SELECT id FROM outbox WHERE aggregate_id = $1`, brief.String()).Scan(&trigger); err != nil {
				t.Fatal(err)
			}
		})
		return brief, trigger
	}
	instance := func(brief, trigger uuid.UUID, status string) (id uuid.UUID) {
		inTx("correlator", func(tx pgx.Tx) {
			if err := tx.QueryRow(ctx, `INSERT INTO saga_instances (tenant_id, saga_name, saga_version, trigger_event_id, context, status)
				VALUES ($1, 'brief_enrichment', 1, $2, jsonb_build_object('brief_id', $3::text), $4::saga_status) RETURNING id`,
				tenants[0], trigger, brief.String(), status).Scan(&id); err != nil {
				t.Fatal(err)
			}
		})
		return id
	}

	// A committed trigger without a saga (lost), a saga without a trigger
	// (unexpected).
	newBrief("lost")
	b2, _ := newBrief("orphan")
	orphan := instance(b2, uuid.New(), "COMPLETED")

	// A journal write by process B under a lease process A claimed.
	inTx("relay-a", func(tx pgx.Tx) {
		exec(tx, `UPDATE saga_instances SET lease_id = gen_random_uuid(), lease_expires_at = now() + interval '1 second' WHERE id = $1`, orphan)
	})
	inTx("relay-b", func(tx pgx.Tx) {
		exec(tx, `UPDATE saga_instances SET current_version = current_version + 1 WHERE id = $1`, orphan)
	})

	// A completed saga whose attach step committed twice and whose publish
	// emitted nothing.
	b3, t3 := newBrief("twice")
	instance(b3, t3, "COMPLETED")
	inTx("relay-a", func(tx pgx.Tx) {
		exec(tx, `UPDATE research_briefs SET status = 'ENRICHING' WHERE id = $1`, b3)
	})
	for range 2 {
		inTx("relay-a", func(tx pgx.Tx) {
			exec(tx, `DELETE FROM brief_sources WHERE brief_id = $1`, b3)
			exec(tx, `INSERT INTO brief_sources (brief_id, document_id, rank) SELECT $1, id, 1 FROM documents LIMIT 1`, b3)
		})
	}
	inTx("relay-a", func(tx pgx.Tx) {
		exec(tx, `UPDATE research_briefs SET enrichment = '{"source_count": 1}', status = 'ENRICHED' WHERE id = $1`, b3)
	})

	// Compensation in the wrong order.
	b4, t4 := newBrief("order")
	i4 := instance(b4, t4, "COMPENSATED")
	inTx("relay-a", func(tx pgx.Tx) {
		for v, ev := range []struct {
			kind string
			step int
		}{{"step_completed", 0}, {"step_completed", 1}, {"compensation_started", 2}, {"step_compensated", 0}, {"step_compensated", 1}} {
			exec(tx, `INSERT INTO saga_events (instance_id, version, kind, step) VALUES ($1, $2, $3, $4)`, i4, v+1, ev.kind, ev.step)
		}
	})

	v := account(t, tg, nil)
	stale, _ := staleWrites(t, tg)
	ef := checkEffects(t, tg)
	_, badOrder, _ := compensationOrder(t, tg)
	// "lost" and "orphan" both have a trigger without a saga.
	r.expect(v.lost == 2, "planted lost triggers are reported", "%d lost of 2", v.lost)
	r.expect(v.unexpected == 1, "a planted saga without a trigger is reported", "%d unexpected", v.unexpected)
	r.expect(stale == 1, "a planted write under another process's lease is reported", "%d stale", stale)
	r.expect(ef.badCount >= 2, "planted double effects and a wrong outcome are reported", "%d briefs off", ef.badCount)
	r.expect(badOrder == 1, "a planted compensation in the wrong order is reported", "%d", badOrder)
	r.head = fmt.Sprintf("planted faults reported: lost %d, unexpected %d, stale %d, effects %d, order %d", v.lost, v.unexpected, stale, ef.badCount, badOrder)
}
