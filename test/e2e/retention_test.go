package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/saga/pgjournal"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

// parcelSaga waits for a reply between two steps, so that a finished
// instance has inbox rows as well as step records and journal events, and
// an unanswered one stays RUNNING for as long as a test lasts.
const parcelSaga = `saga: parcel_track
version: 1
triggers: [{event_type: parcel.ready}]
steps:
  - name: hold
    sql: {query: "SELECT 1"}
  - name: ship
    command:
      event_type: shipping.requested
      aggregate_type: parcel
      aggregate_id: "${ trigger.aggregate_id }"
      payload: { parcel: "${ trigger.payload.parcel }" }
      reply_timeout: 10m
    output: { tracking: "${ reply.tracking }" }
  - name: done
    sql: {query: "SELECT 1"}
`

// coolOffSaga holds its instance RUNNING in a wait step.
const coolOffSaga = `saga: cool_off
version: 1
triggers: [{event_type: cool_off.requested}]
steps:
  - name: before
    sql: {query: "SELECT 1"}
  - name: pause
    wait: {duration: 10m}
  - name: after
    sql: {query: "SELECT 1"}
`

// heldParcel is the parcel whose command nobody answers.
const heldParcel = "p-held"

// writeBrief commits a brief and its trigger, as createBrief does, from any
// goroutine.
func writeBrief(ctx context.Context, db *pgtest.DB, title string) (uuid.UUID, error) {
	event := uuid.New()
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		brief, tenant := uuid.New(), uuid.New()
		if _, err := tx.Exec(ctx, `INSERT INTO research_briefs (id, tenant_id, title, body) VALUES ($1, $2, $3, 'A brief written under retention.')`,
			brief, tenant, title); err != nil {
			return err
		}
		return outbox.Write(ctx, tx, outbox.Message{ID: event, TenantID: tenant, AggregateType: "research_brief",
			AggregateID: brief.String(), EventType: "research_brief.created",
			Payload: map[string]string{"brief_id": brief.String()}})
	})
	return event, err
}

// writeOutbox commits one outbox row, from any goroutine.
func writeOutbox(ctx context.Context, db *pgtest.DB, m outbox.Message) error {
	return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return outbox.Write(ctx, tx, m) })
}

// parcelReady commits a parcel.ready trigger and returns its event id.
func parcelReady(ctx context.Context, db *pgtest.DB, parcel string) (uuid.UUID, error) {
	id := uuid.New()
	return id, writeOutbox(ctx, db, outbox.Message{ID: id, EventType: "parcel.ready", AggregateType: "parcel",
		AggregateID: parcel, Payload: map[string]any{"parcel": parcel}})
}

// shippingService answers every shipping.requested command but those for
// heldParcel, once each, until stop closes; it returns how many it
// answered.
type shippingService struct {
	answered atomic.Int64
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

func startShipping(t *testing.T, db *pgtest.DB) *shippingService {
	s := &shippingService{stop: make(chan struct{})}
	ctx := context.Background()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		done := map[uuid.UUID]bool{}
		for {
			select {
			case <-s.stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			rows, err := db.Pool.Query(ctx, `SELECT id FROM outbox WHERE event_type = 'shipping.requested' AND payload->>'parcel' <> $1`, heldParcel)
			if err != nil {
				continue
			}
			ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
			if err != nil {
				continue
			}
			for _, id := range ids {
				if done[id] {
					continue
				}
				if err := writeOutbox(ctx, db, outbox.Message{EventType: "shipping.done", CorrelationID: id,
					Payload: map[string]any{"ok": true, "tracking": "T-" + id.String()[:8]}}); err != nil {
					t.Errorf("answer command %s: %v", id, err)
					return
				}
				done[id] = true
				s.answered.Add(1)
			}
		}
	}()
	return s
}

func (s *shippingService) Stop() { s.stopOnce.Do(func() { close(s.stop) }); s.wg.Wait() }

// lockWatch samples, every 20 ms, the lock waits of the test's database
// from pg_locks (waitstart: when the wait began) and remembers the longest
// wait whose blocker (pg_blocking_pids) was the retention janitor's
// session, found by its application_name, or the status-count folding each
// round ends with (on the relay's pool), and the longest of any kind.
type lockWatch struct {
	mu           sync.Mutex
	janitorMax   time.Duration
	janitorWorst string
	janitorWaits map[string]bool
	anyMax       time.Duration
	anyWorst     string
	janitorSeen  int
	samples      int

	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

const sqlLockWaits = `
SELECT l.pid::text || '@' || l.waitstart::text, extract(epoch FROM clock_timestamp() - l.waitstart)::float8,
       left(regexp_replace(a.query, '\s+', ' ', 'g'), 140),
       coalesce((SELECT bool_or(j.application_name = $1 OR j.query LIKE '%DELETE FROM saga_status_deltas%')
                 FROM pg_stat_activity j WHERE j.pid = ANY (pg_blocking_pids(l.pid))), false)
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE NOT l.granted AND l.waitstart IS NOT NULL AND a.datname = current_database()`

func watchLocks(t *testing.T, db *pgtest.DB) *lockWatch {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), db.URL)
	if err != nil {
		t.Fatal(err)
	}
	w := &lockWatch{janitorWaits: map[string]bool{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer conn.Close(context.Background())
		ctx := context.Background()
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			var seen bool
			if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database())`,
				pgjournal.RetentionApplicationName).Scan(&seen); err != nil {
				continue
			}
			rows, err := conn.Query(ctx, sqlLockWaits, pgjournal.RetentionApplicationName)
			if err != nil {
				continue
			}
			w.mu.Lock()
			w.samples++
			if seen {
				w.janitorSeen++
			}
			for rows.Next() {
				var key, query string
				var secs float64
				var byJanitor bool
				if rows.Scan(&key, &secs, &query, &byJanitor) != nil {
					continue
				}
				d := time.Duration(secs * float64(time.Second))
				if d > w.anyMax {
					w.anyMax, w.anyWorst = d, query
				}
				if byJanitor {
					w.janitorWaits[key] = true
					if d > w.janitorMax {
						w.janitorMax, w.janitorWorst = d, query
					}
				}
			}
			rows.Close()
			w.mu.Unlock()
		}
	}()
	return w
}

// reset forgets what was measured so far.
func (w *lockWatch) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.janitorMax, w.janitorWorst, w.janitorWaits = 0, "", map[string]bool{}
	w.anyMax, w.anyWorst, w.janitorSeen, w.samples = 0, "", 0, 0
}

func (w *lockWatch) Stop() { w.stopOnce.Do(func() { close(w.stop) }); <-w.done }

// probe proves that the watch sees what it must: a session named as the
// janitor holds a row lock for hold while another session waits for it.
func (w *lockWatch) probe(t *testing.T, db *pgtest.DB, hold time.Duration) time.Duration {
	t.Helper()
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE retention_probe (id int PRIMARY KEY, n int); INSERT INTO retention_probe VALUES (1, 0)`); err != nil {
		t.Fatal(err)
	}
	holder, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(ctx)
	if _, err := holder.Exec(ctx, `SELECT set_config('application_name', $1, false)`, pgjournal.RetentionApplicationName); err != nil {
		t.Fatal(err)
	}
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE retention_probe SET n = n + 1`); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		_, err := db.Pool.Exec(ctx, `UPDATE retention_probe SET n = n + 1`)
		waited <- err
	}()
	time.Sleep(hold) // the lock held: what the watch must see
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	holder.Close(ctx)
	w.mu.Lock()
	got := w.janitorMax
	w.mu.Unlock()
	w.reset()
	return got
}

// TestRetentionUnderLoad: with --saga-retention 2s, while producers write
// triggers steadily, the step records, journal events and inbox rows of
// finished instances go and their tombstones stay (one instance per
// trigger); a RUNNING instance waiting for a reply, one in a wait step and a
// FAILED one keep their history. No start or step waits on the janitor's
// deleting statements for more than 200 ms (pg_locks, sampled every 20 ms).
func TestRetentionUnderLoad(t *testing.T) {
	t.Parallel()
	load, bound := 15*time.Second, 200*time.Millisecond
	if testing.Short() {
		load = 6 * time.Second
	}
	db := pgtest.NewDB(t)
	ctx := context.Background()
	dir := t.TempDir()
	writeSaga(t, dir, "parcel.yaml", parcelSaga, "")
	writeSaga(t, dir, "cool_off.yaml", coolOffSaga, "")

	watch := watchLocks(t, db)
	defer watch.Stop()
	// The watch must see a wait longer than the bound, or the bound proves
	// nothing.
	if got := watch.probe(t, db, 3*bound); got <= bound {
		t.Fatalf("the lock watch saw a %s wait on a session named %s as %s: it cannot tell a wait over %s", 3*bound, pgjournal.RetentionApplicationName, got, bound)
	}

	p := relaytest.Start(t, nil, relayArgs(db, "--sagas", dir, "--saga-retention", "2s")...)
	ship := startShipping(t, db)
	defer ship.Stop()

	// The ones that must keep their history.
	held, err := parcelReady(ctx, db, heldParcel)
	if err != nil {
		t.Fatal(err)
	}
	cool := uuid.New()
	if err := writeOutbox(ctx, db, outbox.Message{ID: cool, EventType: "cool_off.requested", Payload: map[string]any{}}); err != nil {
		t.Fatal(err)
	}
	failed := createBrief(t, db, "Kept for an operator [fail-score][fail-unattach]", true)

	var written atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-time.After(40 * time.Millisecond):
				}
				var err error
				switch {
				case w == 1 && i%2 == 0:
					_, err = parcelReady(ctx, db, fmt.Sprintf("p-%d", i))
				case i%10 == 0:
					_, err = writeBrief(ctx, db, "Under load [fail-score]") // ends COMPENSATED
				default:
					_, err = writeBrief(ctx, db, "Under load")
				}
				if err != nil {
					t.Error(err)
					return
				}
				written.Add(1)
			}
		}()
	}
	// The load lasts at least its length and until the janitor has
	// tombstoned some of it, so that the deleting runs beside the writing
	// even on a slow machine.
	start := time.Now()
	stonesDuringLoad := 0
	for time.Since(start) < load || stonesDuringLoad == 0 {
		if time.Since(start) > load+time.Minute || p.ExitErr() != nil {
			break
		}
		time.Sleep(500 * time.Millisecond)
		stonesDuringLoad = count(t, db, `SELECT count(*) FROM saga_instances WHERE history_deleted_at IS NOT NULL`)
	}
	load = time.Since(start).Round(time.Second)
	close(stop)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if stonesDuringLoad == 0 {
		t.Fatalf("no instance was tombstoned during %s of load with --saga-retention 2s\n%s", load, p.Output())
	}

	triggers := 3 + int(written.Load())
	testkit.WaitFor(t, 2*time.Minute, "every trigger to have its instance", func() bool {
		return count(t, db, `SELECT count(*) FROM saga_instances`) >= triggers
	})
	testkit.WaitFor(t, 2*time.Minute, "the FAILED brief and every finished instance's tombstone", func() bool {
		return statusOf(t, db, failed) == "FAILED" &&
			count(t, db, `SELECT count(*) FROM saga_instances WHERE status NOT IN ('COMPLETED', 'COMPENSATED', 'FAILED', 'RUNNING')
				OR (status IN ('COMPLETED', 'COMPENSATED') AND history_deleted_at IS NULL)
				OR (status = 'RUNNING' AND trigger_event_id NOT IN ($1, $2))`, held, cool) == 0
	})
	watch.Stop()

	// One instance per trigger; the finished ones are tombstones.
	if n := count(t, db, `SELECT count(*) FROM saga_instances`); n != triggers {
		t.Errorf("%d instances for %d triggers", n, triggers)
	}
	if n := count(t, db, `SELECT count(*) FROM (SELECT 1 FROM saga_instances GROUP BY trigger_event_id, saga_name HAVING count(*) > 1) d`); n != 0 {
		t.Errorf("%d triggers started more than one instance", n)
	}
	stones := count(t, db, `SELECT count(*) FROM saga_instances WHERE history_deleted_at IS NOT NULL`)
	if want := triggers - 3; stones != want {
		t.Errorf("%d tombstones, want %d (every trigger but the held, waiting and FAILED ones)", stones, want)
	}
	if n := count(t, db, `SELECT count(*) FROM saga_instances WHERE history_deleted_at IS NOT NULL
		AND (context <> '{}'::jsonb OR last_error IS NOT NULL OR reply IS NOT NULL OR trigger_event_id IS NULL OR completed_at IS NULL)`); n != 0 {
		t.Errorf("%d tombstones kept a payload or lost their trigger", n)
	}
	for table, sql := range map[string]string{
		"saga_steps":  `SELECT count(*) FROM saga_steps s JOIN saga_instances i ON i.id = s.saga_instance_id WHERE i.history_deleted_at IS NOT NULL`,
		"saga_events": `SELECT count(*) FROM saga_events e JOIN saga_instances i ON i.id = e.instance_id WHERE i.history_deleted_at IS NOT NULL`,
		"relay_inbox": `SELECT count(*) FROM relay_inbox r JOIN saga_instances i ON i.id = r.instance_id WHERE i.history_deleted_at IS NOT NULL`,
	} {
		if n := count(t, db, sql); n != 0 {
			t.Errorf("%s: %d rows of tombstoned instances left", table, n)
		}
	}
	// The history existed and went: the janitor's own count.
	m := metrics(t, p.Addr)
	for _, table := range []string{"saga_steps", "saga_events", "relay_inbox"} {
		re := regexp.MustCompile(`(?m)^compensa_retention_deleted_rows_total\{table="` + table + `"\} (\d+)$`)
		got := re.FindStringSubmatch(m)
		if got == nil || got[1] == "0" {
			t.Errorf("compensa_retention_deleted_rows_total{table=%q}: %v, want rows deleted", table, got)
		}
	}

	// What must stay, stays.
	for _, k := range []struct {
		name   string
		event  uuid.UUID
		status string
		kind   string
	}{
		{"waiting for a reply", held, "RUNNING", "step_awaiting"},
		{"in a wait step", cool, "RUNNING", "step_waiting"},
		{"FAILED", failed, "FAILED", "compensation_failed"},
	} {
		var status string
		var stoned bool
		var steps, events int
		var kinds []string
		err := db.Pool.QueryRow(ctx, `SELECT i.status::text, i.history_deleted_at IS NOT NULL,
				(SELECT count(*) FROM saga_steps s WHERE s.saga_instance_id = i.id),
				(SELECT count(*) FROM saga_events e WHERE e.instance_id = i.id),
				(SELECT coalesce(array_agg(DISTINCT e.kind::text), '{}') FROM saga_events e WHERE e.instance_id = i.id)
			FROM saga_instances i WHERE i.trigger_event_id = $1`, k.event).Scan(&status, &stoned, &steps, &events, &kinds)
		if err != nil {
			t.Fatalf("the instance %s: %v", k.name, err)
		}
		if status != k.status || stoned || steps == 0 || events == 0 || !strings.Contains(strings.Join(kinds, ","), k.kind) {
			t.Errorf("the instance %s: %s, tombstoned %v, %d step records, %d events %v; want %s with its history (a %s event)",
				k.name, status, stoned, steps, events, kinds, k.status, k.kind)
		}
	}
	if ship.answered.Load() == 0 {
		t.Errorf("no command was answered: the inbox was never exercised")
	}
	p.Stop(30 * time.Second)

	watch.mu.Lock()
	defer watch.mu.Unlock()
	if watch.janitorSeen == 0 {
		t.Errorf("the janitor's session (%s) never showed in %d samples: its waits cannot be told", pgjournal.RetentionApplicationName, watch.samples)
	}
	t.Logf("retention under load: %d triggers in %s (%d tombstoned while the load ran, %d in all), %d commands answered; %d lock samples; "+
		"waits on the janitor: %d, longest %s %q; longest lock wait of any kind %s %q",
		triggers, load, stonesDuringLoad, stones, ship.answered.Load(), watch.samples,
		len(watch.janitorWaits), watch.janitorMax.Round(time.Millisecond), watch.janitorWorst, watch.anyMax.Round(time.Millisecond), watch.anyWorst)
	if watch.janitorMax > bound {
		t.Errorf("a statement waited %s on the janitor (%q), want at most %s", watch.janitorMax, watch.janitorWorst, bound)
	}
}

// instanceIDs maps each trigger event to its instances.
func instanceIDs(t *testing.T, db *pgtest.DB) map[uuid.UUID][]uuid.UUID {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT trigger_event_id, id FROM saga_instances ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[uuid.UUID][]uuid.UUID{}
	for rows.Next() {
		var ev, id uuid.UUID
		if err := rows.Scan(&ev, &id); err != nil {
			t.Fatal(err)
		}
		out[ev] = append(out[ev], id)
	}
	return out
}

// TestResyncAfterHistoryDeletedStartsNothingTwice: the triggers' instances
// finish and become tombstones (--saga-retention 1s); the slot is dropped
// while the relay is stopped; the next relay resyncs, re-reading every one
// of those triggers (and the replies), and the tombstones alone absorb them:
// one instance per trigger, the same ones, no history written again.
func TestResyncAfterHistoryDeletedStartsNothingTwice(t *testing.T) {
	t.Parallel()
	briefs, parcels := 40, 5
	if testing.Short() {
		briefs, parcels = 10, 2
	}
	db := pgtest.NewDB(t)
	ctx := context.Background()
	dir := t.TempDir()
	writeSaga(t, dir, "parcel.yaml", parcelSaga, "")
	args := relayArgs(db, "--sagas", dir, "--on-slot-lost", "resync", "--resync-margin", "1m", "--saga-retention", "1s")
	p := relaytest.Start(t, nil, args...)
	ship := startShipping(t, db)
	defer ship.Stop()
	for i := range briefs {
		title := "Resynced"
		if i%4 == 0 {
			title += " [fail-score]"
		}
		if _, err := writeBrief(ctx, db, title); err != nil {
			t.Fatal(err)
		}
	}
	for i := range parcels {
		if _, err := parcelReady(ctx, db, fmt.Sprintf("p-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	triggers := briefs + parcels
	testkit.WaitFor(t, 2*time.Minute, "every instance to finish and become a tombstone", func() bool {
		return count(t, db, `SELECT count(*) FROM saga_instances WHERE history_deleted_at IS NOT NULL AND status IN ('COMPLETED', 'COMPENSATED')`) == triggers
	})
	ship.Stop()
	p.Stop(30 * time.Second)
	before := instanceIDs(t, db)
	replies := count(t, db, `SELECT count(*) FROM outbox WHERE event_type = 'shipping.done'`)
	if len(before) != triggers || replies != parcels {
		t.Fatalf("%d triggers with instances, %d replies; want %d and %d", len(before), replies, triggers, parcels)
	}

	if _, err := db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, db.Slot); err != nil {
		t.Fatal(err)
	}
	p = relaytest.Start(t, nil, args...)
	// A trigger written after the resync: the stream hands it over after
	// the re-read rows, so its instance means the re-read is done.
	marker, err := writeBrief(ctx, db, "After the resync")
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 2*time.Minute, "the trigger written after the resync to start its saga", func() bool { return instancesFor(t, db, marker) == 1 })
	// The marker may be among the re-read rows, whose instances start
	// before the stream logs the hand-over: wait for that line too.
	handed := regexp.MustCompile(`msg="snapshot handed over"[^\n]* rows=(\d+)`)
	var m []string
	testkit.WaitFor(t, 30*time.Second, "the resync's re-read in the log", func() bool {
		m = handed.FindStringSubmatch(p.Output())
		return m != nil
	})
	if reread, _ := strconv.Atoi(m[1]); reread < triggers+replies {
		t.Fatalf("the resync re-read %d outbox rows, want at least the %d triggers and %d replies", reread, triggers, replies)
	}

	after := instanceIDs(t, db)
	if len(after) != triggers+1 {
		t.Errorf("%d triggers with instances after the resync, want %d", len(after), triggers+1)
	}
	twice := 0
	for ev, ids := range before {
		if len(after[ev]) != 1 || after[ev][0] != ids[0] {
			twice++
			t.Errorf("trigger %s: instances %v before the resync, %v after", ev, ids, after[ev])
		}
	}
	if n := count(t, db, `SELECT count(*) FROM saga_instances WHERE trigger_event_id <> $1 AND history_deleted_at IS NULL`, marker); n != 0 {
		t.Errorf("%d tombstones were brought back to life by the resync", n)
	}
	if n := count(t, db, `SELECT count(*) FROM saga_steps s JOIN saga_instances i ON i.id = s.saga_instance_id WHERE i.trigger_event_id <> $1`, marker); n != 0 {
		t.Errorf("%d step records were written again for tombstoned instances", n)
	}
	if n := count(t, db, `SELECT count(*) FROM relay_dead_letters`); n != 0 {
		t.Errorf("%d events were parked by the resync", n)
	}
	p.Stop(30 * time.Second)
	t.Logf("resync after retention: %s outbox rows re-read for %d tombstoned triggers and %d replies; %d triggers started twice", m[1], triggers, replies, twice)
}

// TestStartByHandRepeatedAfterTombstone: POST /v1/sagas with an
// idempotency key, repeated once the instance it started is a tombstone
// and its outbox row is gone, answers as a repeat (200, created false, the
// same instance) and writes nothing. Once the tombstone itself is gone
// (after --dedupe-window), the key starts again: the promise lasts as long
// as the window, as README says.
func TestStartByHandRepeatedAfterTombstone(t *testing.T) {
	t.Parallel()
	const token = "tok-for-test-0123456789abcdef"
	db := pgtest.NewDB(t)
	ctx := context.Background()
	dir := t.TempDir()
	writeSaga(t, dir, "note.yaml", `saga: note
version: 1
triggers: [{event_type: note.requested}]
steps:
  - name: write
    sql: {query: "SELECT 1"}
`, "")
	p := relaytest.Start(t, nil, relayArgs(db, "--sagas", dir, "--saga-retention", "1s", "--api-token", token)...)
	type result struct {
		EventID    uuid.UUID  `json:"event_id"`
		Created    bool       `json:"created"`
		InstanceID *uuid.UUID `json:"instance_id"`
	}
	start := func(key string) (int, result) {
		t.Helper()
		body := fmt.Sprintf(`{"saga": "note", "payload": {"n": 1}, "idempotency_key": %q}`, key)
		req, _ := http.NewRequest(http.MethodPost, "http://"+p.Addr+"/v1/sagas", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var r result
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			t.Fatalf("POST /v1/sagas: %d, %v", resp.StatusCode, err)
		}
		return resp.StatusCode, r
	}

	code, first := start("order-42")
	if code != http.StatusAccepted || !first.Created {
		t.Fatalf("first start: %d %+v, want 202 created", code, first)
	}
	var inst uuid.UUID
	testkit.WaitFor(t, time.Minute, "the instance to finish and become a tombstone", func() bool {
		err := db.Pool.QueryRow(ctx, `SELECT id FROM saga_instances WHERE trigger_event_id = $1 AND status = 'COMPLETED' AND history_deleted_at IS NOT NULL`, first.EventID).Scan(&inst)
		return err == nil
	})
	if n := count(t, db, `SELECT count(*) FROM saga_steps WHERE saga_instance_id = $1`, inst); n != 0 {
		t.Fatalf("the tombstone kept %d step records", n)
	}
	// The outbox row goes too (--outbox-retention, say): the tombstone is
	// the only guard left.
	if _, err := db.Pool.Exec(ctx, `DELETE FROM outbox WHERE id = $1`, first.EventID); err != nil {
		t.Fatal(err)
	}
	code, again := start("order-42")
	if code != http.StatusOK || again.Created || again.EventID != first.EventID || again.InstanceID == nil || *again.InstanceID != inst {
		t.Fatalf("the same key after the history was deleted: %d %+v, want 200, created false, instance %s", code, again, inst)
	}
	if n := count(t, db, `SELECT count(*) FROM outbox WHERE id = $1`, first.EventID); n != 0 {
		t.Fatalf("the repeat wrote the trigger again")
	}
	// A new key behind it: the stream is in order, so once it has its
	// instance, anything the repeat had written would have started too.
	code, other := start("order-43")
	if code != http.StatusAccepted {
		t.Fatalf("a new key: %d, want 202", code)
	}
	testkit.WaitFor(t, time.Minute, "the new key's instance", func() bool { return instancesFor(t, db, other.EventID) == 1 })
	if n := instancesFor(t, db, first.EventID); n != 1 {
		t.Fatalf("%d instances for one idempotency key after its history was deleted, want 1", n)
	}

	// Past the dedupe window the janitor deletes the tombstone; then the
	// key is new again. Deleted here by hand, since the shortest window the
	// relay accepts is minutes.
	if _, err := db.Pool.Exec(ctx, `DELETE FROM saga_instances WHERE id = $1`, inst); err != nil {
		t.Fatal(err)
	}
	code, late := start("order-42")
	if code != http.StatusAccepted || !late.Created || late.EventID != first.EventID {
		t.Fatalf("the same key after its tombstone was deleted: %d %+v, want 202 created (outside the dedupe window's promise)", code, late)
	}
	p.Stop(30 * time.Second)
}

// TestRetentionFootprint measures what a finished saga of the demo
// (brief_enrichment: four steps) keeps in the saga tables (instance, step
// records, journal, inbox, with their indexes; compacted by VACUUM FULL)
// with its history and as a tombstone. README's Retention section quotes
// the figures.
func TestRetentionFootprint(t *testing.T) {
	t.Parallel()
	n := 500
	if testing.Short() {
		n = 100
	}
	db := pgtest.NewDB(t)
	ctx := context.Background()
	size := func() int64 {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, `VACUUM FULL saga_instances, saga_steps, saga_events, relay_inbox`); err != nil {
			t.Fatal(err)
		}
		var b int64
		if err := db.Pool.QueryRow(ctx, `SELECT sum(pg_total_relation_size(c))::bigint FROM unnest('{saga_instances,saga_steps,saga_events,relay_inbox}'::regclass[]) c`).Scan(&b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	empty := size()
	p := relaytest.Start(t, nil, relayArgs(db, "--saga-retention", "0", "--dedupe-window", "0")...)
	for range n {
		if _, err := writeBrief(ctx, db, "Measured"); err != nil {
			t.Fatal(err)
		}
	}
	testkit.WaitFor(t, 3*time.Minute, fmt.Sprintf("%d sagas to complete", n), func() bool {
		return count(t, db, `SELECT count(*) FROM saga_instances WHERE status = 'COMPLETED'`) == n
	})
	p.Stop(30 * time.Second)
	kept := size()

	p = relaytest.Start(t, nil, relayArgs(db, "--saga-retention", "1s")...)
	testkit.WaitFor(t, 2*time.Minute, "every instance to become a tombstone", func() bool {
		return count(t, db, `SELECT count(*) FROM saga_instances WHERE history_deleted_at IS NOT NULL`) == n
	})
	p.Stop(30 * time.Second)
	stoned := size()

	perKept, perStone := float64(kept-empty)/float64(n), float64(stoned-empty)/float64(n)
	day := 100 * 86400.0
	t.Logf("footprint of the demo saga over %d instances: %.0f bytes with its history, %.0f as a tombstone; "+
		"at 100 sagas/s, a day of history is %.1f GB and 30 days of tombstones %.1f GB",
		n, perKept, perStone, perKept*day/1e9, perStone*day*30/1e9)
	if perStone <= 0 || perStone*3 > perKept {
		t.Errorf("a tombstone keeps %.0f bytes and a finished saga with its history %.0f: want the tombstone under a third", perStone, perKept)
	}
}
