//go:build chaos

package chaos

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/google/uuid"
)

// verdicts is the total-queue account of the trigger events: every committed
// research_brief.created row is lost (no saga), duplicated (more than one),
// or fine; a saga whose trigger was never committed is unexpected.
type verdicts struct {
	triggers, fine, lost, duplicated, unexpected int
	// ackedMissing counts briefs whose COMMIT returned but whose trigger row
	// is not in the database: a write the database lost.
	ackedMissing int
	// unknownCommitted counts briefs whose COMMIT failed but which are in.
	unknownCommitted int
	statuses         map[string]int
	examples         []string
}

// account checks the trigger events of the default outbox table against the
// saga instances, and the producer's acknowledged briefs against the table.
func account(t *testing.T, tg *target, prod *producer) verdicts {
	t.Helper()
	ctx := context.Background()
	v := verdicts{statuses: map[string]int{}}
	rows, err := tg.Pool.Query(ctx, `SELECT o.id, o.aggregate_id, (SELECT count(*) FROM saga_instances i WHERE i.trigger_event_id = o.id)
		FROM outbox o WHERE o.event_type = 'research_brief.created'`)
	if err != nil {
		t.Fatal(err)
	}
	briefsIn := map[string]bool{}
	for rows.Next() {
		var id uuid.UUID
		var brief string
		var n int
		if err := rows.Scan(&id, &brief, &n); err != nil {
			t.Fatal(err)
		}
		briefsIn[brief] = true
		v.triggers++
		switch {
		case n == 0:
			v.lost++
			v.example("lost trigger %s (brief %s)", id, brief)
		case n > 1:
			v.duplicated++
			v.example("trigger %s started %d sagas", id, n)
		default:
			v.fine++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	n, err := count(ctx, tg.Pool, `SELECT count(*) FROM saga_instances i
		WHERE NOT EXISTS (SELECT 1 FROM outbox o WHERE o.id = i.trigger_event_id AND o.event_type = 'research_brief.created')`)
	if err != nil {
		t.Fatal(err)
	}
	v.unexpected = int(n)
	if prod != nil {
		for _, id := range prod.acked() {
			if !briefsIn[id.String()] {
				v.ackedMissing++
				v.example("brief %s was acknowledged by COMMIT but its trigger is not in the outbox", id)
			}
		}
		prod.mu.Lock()
		for _, id := range prod.unknown {
			if briefsIn[id.String()] {
				v.unknownCommitted++
			}
		}
		prod.mu.Unlock()
	}
	srows, err := tg.Pool.Query(ctx, `SELECT status::text, count(*) FROM saga_instances GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for srows.Next() {
		var s string
		var n int
		srows.Scan(&s, &n)
		v.statuses[s] = n
	}
	return v
}

func (v *verdicts) example(format string, args ...any) {
	if len(v.examples) < 5 {
		v.examples = append(v.examples, fmt.Sprintf(format, args...))
	}
}

func (v verdicts) nonTerminal() int { return v.statuses["RUNNING"] + v.statuses["COMPENSATING"] }

func (v verdicts) statusLine() string {
	var keys []string
	for k := range v.statuses {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, v.statuses[k]))
	}
	return strings.Join(parts, ", ")
}

// report writes the account's figures and promises.
func (v verdicts) report(r *report) {
	r.figure("trigger events", "%d committed: %d fine, %d lost, %d duplicated; %d unexpected sagas", v.triggers, v.fine, v.lost, v.duplicated, v.unexpected)
	r.figure("saga instances", "%s", v.statusLine())
	if v.unknownCommitted > 0 {
		r.figure("commits with unknown outcome", "%d of those briefs did commit (and were accounted like any other)", v.unknownCommitted)
	}
	for _, e := range v.examples {
		r.figure("example", "%s", e)
	}
	r.expect(v.lost == 0, "0 committed triggers without a saga", "%d", v.lost)
	r.expect(v.duplicated == 0, "0 triggers with more than one saga", "%d", v.duplicated)
	r.expect(v.unexpected == 0, "0 sagas without a committed trigger", "%d", v.unexpected)
	r.expect(v.ackedMissing == 0, "0 acknowledged briefs missing", "%d", v.ackedMissing)
	r.expect(v.nonTerminal() == 0, "every saga terminal at the end", "%d RUNNING or COMPENSATING", v.nonTerminal())
}

// effects checks, brief by brief, that every step's effects were committed
// exactly once (counted in committed transactions by the audit triggers) and
// that the brief, its sources and its emitted outbox rows agree with how its
// saga ended.
type effects struct {
	enriched, compensated, checked int
	bad                            []string
	badCount                       int
	// invisible counts sagas that failed because their first step could not
	// see the brief its trigger's transaction inserted: started from a
	// transaction decoded before it was visible.
	invisible int
	invisEx   []string
}

const effectsSQL = `
WITH e AS (
	SELECT brief_id,
		count(DISTINCT xid) FILTER (WHERE kind = 'DRAFT>ENRICHING') AS claim,
		count(DISTINCT xid) FILTER (WHERE kind = 'attach') AS attach,
		count(DISTINCT xid) FILTER (WHERE kind = 'score') AS score,
		count(DISTINCT xid) FILTER (WHERE kind = 'ENRICHING>ENRICHED') AS publish,
		count(DISTINCT xid) FILTER (WHERE kind = 'ENRICHING>DRAFT') AS unclaim,
		count(DISTINCT xid) FILTER (WHERE kind = 'detach') AS detach,
		count(DISTINCT xid) FILTER (WHERE kind = 'unscore') AS unscore,
		count(DISTINCT xid) FILTER (WHERE kind = 'ENRICHED>DRAFT') AS unpublish
	FROM chaos_effects GROUP BY brief_id
), s AS (SELECT brief_id, count(*) AS n FROM brief_sources GROUP BY 1),
ob AS (
	SELECT aggregate_id,
		count(*) FILTER (WHERE event_type = 'research_brief.enriched') AS enriched,
		count(*) FILTER (WHERE event_type = 'research_brief.enrichment_reverted') AS reverted
	FROM outbox WHERE event_type IN ('research_brief.enriched', 'research_brief.enrichment_reverted') GROUP BY 1
)
SELECT b.id, b.status::text, b.title LIKE '%[fail-score]%', coalesce(i.status::text, ''), coalesce(i.last_error, ''),
	coalesce(s.n, 0), coalesce((b.enrichment->>'source_count')::int, -1),
	coalesce(e.claim, 0), coalesce(e.attach, 0), coalesce(e.score, 0), coalesce(e.publish, 0),
	coalesce(e.unclaim, 0), coalesce(e.detach, 0), coalesce(e.unscore, 0), coalesce(e.unpublish, 0),
	coalesce(ob.enriched, 0), coalesce(ob.reverted, 0)
FROM research_briefs b
LEFT JOIN saga_instances i ON i.context->>'brief_id' = b.id::text
LEFT JOIN e ON e.brief_id = b.id
LEFT JOIN s ON s.brief_id = b.id
LEFT JOIN ob ON ob.aggregate_id = b.id::text`

func checkEffects(t *testing.T, tg *target) effects {
	t.Helper()
	rows, err := tg.Pool.Query(context.Background(), effectsSQL)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ef effects
	for rows.Next() {
		var id uuid.UUID
		var status, saga, lastErr string
		var fail bool
		var sources, sourceCount, claim, attach, score, publish, unclaim, detach, unscore, unpublish, enriched, reverted int
		if err := rows.Scan(&id, &status, &fail, &saga, &lastErr, &sources, &sourceCount, &claim, &attach, &score, &publish,
			&unclaim, &detach, &unscore, &unpublish, &enriched, &reverted); err != nil {
			t.Fatal(err)
		}
		ef.checked++
		var why []string
		want := func(ok bool, format string, args ...any) {
			if !ok {
				why = append(why, fmt.Sprintf(format, args...))
			}
		}
		if saga == "COMPENSATED" && !fail && claim+attach+score+publish+unclaim == 0 && strings.Contains(lastErr, "does not exist") {
			ef.invisible++
			if len(ef.invisEx) < 3 {
				ef.invisEx = append(ef.invisEx, fmt.Sprintf("brief %s: %s", id, clipText(lastErr, 120)))
			}
			continue
		}
		switch saga {
		case "COMPLETED":
			ef.enriched++
			want(!fail, "a [fail-score] brief completed")
			want(status == "ENRICHED", "status %s", status)
			want(claim == 1 && attach <= 1 && score == 1 && publish == 1, "claim %d attach %d score %d publish %d (want 1 each, attach ≤ 1)", claim, attach, score, publish)
			want(unclaim == 0 && detach == 0 && unscore == 0 && unpublish == 0, "compensations ran on a completed saga")
			want(sources <= 5 && sources == sourceCount, "%d sources, enrichment says %d", sources, sourceCount)
			want(enriched == 1 && reverted == 0, "%d research_brief.enriched and %d reverted rows (want 1 and 0)", enriched, reverted)
		case "COMPENSATED":
			ef.compensated++
			want(fail, "a brief without [fail-score] was compensated")
			want(status == "DRAFT" && sourceCount == -1, "status %s, enrichment source_count %d", status, sourceCount)
			want(claim == 1 && attach <= 1 && score == 0 && publish == 0, "claim %d attach %d score %d publish %d (want 1, ≤1, 0, 0)", claim, attach, score, publish)
			want(unclaim == 1 && detach == attach && unpublish == 0, "unclaim %d detach %d for attach %d", unclaim, detach, attach)
			want(sources == 0, "%d sources left", sources)
			want(enriched == 0 && reverted == 0, "%d enriched and %d reverted rows (want none)", enriched, reverted)
		default:
			want(false, "saga %q", saga)
		}
		if len(why) > 0 {
			ef.badCount++
			if len(ef.bad) < 5 {
				ef.bad = append(ef.bad, fmt.Sprintf("brief %s (%s): %s", id, saga, strings.Join(why, "; ")))
			}
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ef
}

func (ef effects) report(r *report) {
	r.figure("step effects audited", "%d briefs: %d enriched, %d compensated", ef.checked, ef.enriched, ef.compensated)
	for _, b := range ef.bad {
		r.figure("example", "%s", b)
	}
	r.expect(ef.badCount == 0, "every step's effects exactly once", "%d briefs off", ef.badCount)
	if ef.invisible > 0 {
		r.figure("sagas that ran before their trigger was visible", "%d: compensated at claim_brief, which found no brief", ef.invisible)
		for _, e := range ef.invisEx {
			r.figure("example", "%s", e)
		}
	}
	r.expect(ef.invisible == 0, "0 sagas acting before their trigger is visible", "%d", ef.invisible)
}

// staleWrites counts journal writes made by another process than the one
// holding the lease the instance carried when the write landed.
func staleWrites(t *testing.T, tg *target) (int64, []string) {
	t.Helper()
	ctx := context.Background()
	n, err := count(ctx, tg.Pool, `SELECT count(*) FROM chaos_writes WHERE lease_app IS DISTINCT FROM app`)
	if err != nil {
		t.Fatal(err)
	}
	var ex []string
	rows, err := tg.Pool.Query(ctx, `SELECT instance_id::text || ' v' || version || ' written by ' || app || ' under a lease of ' || coalesce(lease_app, 'nobody')
		FROM chaos_writes WHERE lease_app IS DISTINCT FROM app LIMIT 5`)
	if err == nil {
		for rows.Next() {
			var s string
			rows.Scan(&s)
			ex = append(ex, s)
		}
		rows.Close()
	}
	return n, ex
}

// compensationOrder checks every instance's journal that started a
// compensation: the steps it compensated or skipped (never acted) come in
// strictly decreasing order, and every step it completed was compensated.
func compensationOrder(t *testing.T, tg *target) (instances, bad int, examples []string) {
	t.Helper()
	rows, err := tg.Pool.Query(context.Background(), `
		SELECT instance_id,
			coalesce(array_agg(step ORDER BY version) FILTER (WHERE kind IN ('step_compensated', 'compensation_skipped')), '{}'),
			coalesce(array_agg(step ORDER BY version) FILTER (WHERE kind = 'step_compensated'), '{}'),
			coalesce(array_agg(step ORDER BY version) FILTER (WHERE kind = 'step_completed'), '{}')
		FROM saga_events GROUP BY instance_id
		HAVING bool_or(kind = 'compensation_started')`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id uuid.UUID
		var walked, comp, done []int32
		if err := rows.Scan(&id, &walked, &comp, &done); err != nil {
			t.Fatal(err)
		}
		instances++
		ok := true
		for i := 1; i < len(walked); i++ {
			ok = ok && walked[i] < walked[i-1]
		}
		undone := map[int32]bool{}
		for _, s := range comp {
			undone[s] = true
		}
		for _, s := range done {
			ok = ok && undone[s]
		}
		if !ok {
			bad++
			if len(examples) < 5 {
				examples = append(examples, fmt.Sprintf("instance %s completed %v, walked back %v, compensated %v", id, done, walked, comp))
			}
		}
	}
	return instances, bad, examples
}
