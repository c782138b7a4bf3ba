package cdc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// recordingSink commits, like the correlator, its effects and the checkpoint
// in one transaction: the checkpoint row first (locked, so two streams that
// both think they lead cannot interleave), then one row per event in
// cdc_handled whose n counts how many times the event was committed past
// the checkpoint. n > 1 is a duplicate the stream let through.
type recordingSink struct {
	pool *pgxpool.Pool
	// before runs before the transaction; an error fails the batch.
	before atomic.Pointer[func(context.Context, cdc.Batch) error]

	// keep retains the events themselves, for tests that inspect them.
	keep bool

	mu      sync.Mutex
	batches []cdc.Batch // events stripped, for memory
	fresh   []bool
	maxLen  int
	events  []outbox.Event
	// acked counts the events of every batch HandleBatch returned nil for.
	acked int
}

const handledDDL = `CREATE TABLE IF NOT EXISTS cdc_handled (
	event_id uuid PRIMARY KEY, raw_id text, event_type text, n int NOT NULL DEFAULT 1,
	payload_len int, poison text, snapshot bool, lsn pg_lsn)`

func newSink(t testing.TB, pool *pgxpool.Pool) *recordingSink {
	t.Helper()
	if _, err := pool.Exec(context.Background(), handledDDL); err != nil {
		t.Fatal(err)
	}
	return &recordingSink{pool: pool}
}

func (s *recordingSink) setBefore(f func(context.Context, cdc.Batch) error) { s.before.Store(&f) }

func (s *recordingSink) HandleBatch(ctx context.Context, b cdc.Batch) error {
	if f := s.before.Load(); f != nil && *f != nil {
		if err := (*f)(ctx, b); err != nil {
			return err
		}
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var fresh bool
	if b.Partial {
		var behind bool
		err := tx.QueryRow(ctx, `SELECT lsn >= $2::pg_lsn FROM relay_checkpoints WHERE slot_name = $1 FOR UPDATE`, b.Slot, b.EndLSN.String()).Scan(&behind)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		fresh = !behind
	} else {
		// As the correlator does: updated_at is the source commit time.
		var commitTime *time.Time
		if !b.CommitTime.IsZero() {
			commitTime = &b.CommitTime
		}
		tag, err := tx.Exec(ctx, `INSERT INTO relay_checkpoints AS c (slot_name, lsn, updated_at) VALUES ($1, $2::pg_lsn, coalesce($3::timestamptz, now()))
			ON CONFLICT (slot_name) DO UPDATE SET lsn = EXCLUDED.lsn, updated_at = EXCLUDED.updated_at WHERE c.lsn < EXCLUDED.lsn`, b.Slot, b.EndLSN.String(), commitTime)
		if err != nil {
			return err
		}
		fresh = tag.RowsAffected() == 1
	}
	if fresh && len(b.Events) > 0 {
		n := len(b.Events)
		ids, raws, types, poison := make([]uuid.UUID, n), make([]string, n), make([]string, n), make([]string, n)
		lens := make([]int32, n)
		for i, e := range b.Events {
			ids[i], raws[i], types[i], poison[i], lens[i] = e.ID, e.RawID, e.EventType, e.Poison, int32(len(e.Payload))
		}
		_, err := tx.Exec(ctx, `INSERT INTO cdc_handled (event_id, raw_id, event_type, payload_len, poison, snapshot, lsn)
			SELECT *, $6::bool, $7::pg_lsn FROM unnest($1::uuid[], $2::text[], $3::text[], $4::int[], $5::text[])
			ON CONFLICT (event_id) DO UPDATE SET n = cdc_handled.n + 1`, ids, raws, types, lens, poison, b.Snapshot, b.EndLSN.String())
		if err != nil {
			return err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	if s.keep && fresh {
		s.events = append(s.events, b.Events...)
	}
	s.maxLen = max(s.maxLen, len(b.Events))
	s.acked += len(b.Events)
	meta := b
	meta.Events = nil
	s.batches = append(s.batches, meta)
	s.fresh = append(s.fresh, fresh)
	s.mu.Unlock()
	return nil
}

// ackedEvents is how many events HandleBatch reported committed, replays
// included.
func (s *recordingSink) ackedEvents() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.acked
}

func (s *recordingSink) snapshot() []cdc.Batch {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]cdc.Batch(nil), s.batches...)
}

func (s *recordingSink) kept() []outbox.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]outbox.Event(nil), s.events...)
}

// handledCounts returns event id → n.
func handledCounts(t testing.TB, pool *pgxpool.Pool) map[uuid.UUID]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT event_id, n FROM cdc_handled`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[uuid.UUID]int{}
	for rows.Next() {
		var id uuid.UUID
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		out[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func countHandled(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM cdc_handled`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// countHandledOf counts how many of ids were handled. Tests whose producer
// retries through faults wait on this rather than on countHandled: a commit
// whose acknowledgement the fault cut off is handled too, without being in
// ids, so the total can reach len(ids) while some of ids are still in flight.
func countHandledOf(t testing.TB, pool *pgxpool.Pool, ids []uuid.UUID) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM cdc_handled WHERE event_id = ANY($1)`, ids).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// logBuffer collects a test's logs and prints them when the test fails.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func testLogger(t testing.TB) (*slog.Logger, *logBuffer) {
	lb := &logBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("stream logs:\n%s", lb.String())
		}
	})
	return slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug})), lb
}

// baseConfig is a stream config with short intervals for tests.
func baseConfig(t testing.TB, db *pgtest.DB) cdc.Config {
	cfg, _ := baseConfigLogs(t, db)
	return cfg
}

// baseConfigLogs is baseConfig with the stream's logs at hand.
func baseConfigLogs(t testing.TB, db *pgtest.DB) (cdc.Config, *logBuffer) {
	log, lb := testLogger(t)
	return cdc.Config{
		DatabaseURL:        db.URL,
		Slot:               db.Slot,
		Publication:        db.Publication,
		StatusInterval:     100 * time.Millisecond,
		HeartbeatInterval:  300 * time.Millisecond,
		LeaderPollInterval: 200 * time.Millisecond,
		MaxReconnectWait:   500 * time.Millisecond,
		Logger:             log,
	}, lb
}

// running is a Stream running in the background.
type running struct {
	s      *cdc.Stream
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

func startStream(t testing.TB, cfg cdc.Config, sink cdc.Sink) *running {
	t.Helper()
	s, err := cdc.NewStream(cfg, sink)
	if err != nil {
		t.Fatalf("NewStream: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{s: s, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- s.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop cancels the stream and returns Run's result.
func (r *running) stop(t testing.TB) error {
	r.once.Do(func() {
		r.cancel()
		select {
		case r.err = <-r.done:
		case <-time.After(60 * time.Second):
			r.err = errors.New("Run did not return within 60s of cancel")
			t.Error(r.err)
		}
	})
	return r.err
}

// crash stops the stream like a killed process.
func (r *running) crash(t testing.TB) {
	cdc.CrashOnStop(r.s)
	r.stop(t)
}

// wait returns Run's result if it ends within d.
func (r *running) wait(d time.Duration) (error, bool) {
	select {
	case err := <-r.done:
		r.once.Do(func() { r.err = err })
		return err, true
	case <-time.After(d):
		return nil, false
	}
}

// writeEvents commits n outbox rows in one application transaction and
// returns their ids.
func writeEvents(t testing.TB, pool *pgxpool.Pool, n int, eventType string) []uuid.UUID {
	t.Helper()
	ids, err := tryWriteEvents(pool, n, eventType)
	if err != nil {
		t.Fatalf("write events: %v", err)
	}
	return ids
}

// tryWriteEvents is writeEvents for goroutines other than the test's.
func tryWriteEvents(pool *pgxpool.Pool, n int, eventType string) ([]uuid.UUID, error) {
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{EventType: eventType, Payload: map[string]any{"i": i}}
	}
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error { return outbox.Write(context.Background(), tx, msgs...) })
	if err != nil {
		return nil, err
	}
	ids := make([]uuid.UUID, n)
	for i := range msgs {
		ids[i] = msgs[i].ID
	}
	return ids, nil
}

// producer writes small transactions until stopped.
type producer struct {
	stop chan struct{}
	done chan struct{}
	ids  []uuid.UUID
	err  error
}

func startProducer(pool *pgxpool.Pool, perTx int, pause time.Duration) *producer {
	p := &producer{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for {
			select {
			case <-p.stop:
				return
			default:
			}
			ids, err := tryWriteEvents(pool, perTx, "produced")
			if err != nil {
				p.err = err
				return
			}
			p.ids = append(p.ids, ids...)
			time.Sleep(pause)
		}
	}()
	return p
}

// startRetryingProducer is a producer that rides out a server restart: it
// records only the events whose commit it saw succeed.
func startRetryingProducer(pool *pgxpool.Pool) *producer {
	p := &producer{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for {
			select {
			case <-p.stop:
				return
			default:
			}
			if ids, err := tryWriteEvents(pool, 3, "produced"); err == nil {
				p.ids = append(p.ids, ids...)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	return p
}

// finish stops the producer and returns what it committed.
func (p *producer) finish(t testing.TB) []uuid.UUID {
	t.Helper()
	close(p.stop)
	<-p.done
	if p.err != nil {
		t.Fatalf("producer: %v", p.err)
	}
	return p.ids
}

func slotState(t testing.TB, pool *pgxpool.Pool, slot string) (confirmed pglogrepl.LSN, active bool) {
	t.Helper()
	var s string
	err := pool.QueryRow(context.Background(), `SELECT coalesce(confirmed_flush_lsn, '0/0')::text, active FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&s, &active)
	if err != nil {
		t.Fatalf("slot %s: %v", slot, err)
	}
	l, err := pglogrepl.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return l, active
}

func checkpointLSN(t testing.TB, pool *pgxpool.Pool, slot string) pglogrepl.LSN {
	t.Helper()
	var s string
	err := pool.QueryRow(context.Background(), `SELECT lsn::text FROM relay_checkpoints WHERE slot_name = $1`, slot).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	l, _ := pglogrepl.ParseLSN(s)
	return l
}

func exec(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// waitHandled waits until the sink has handled every one of ids.
func waitHandled(t testing.TB, pool *pgxpool.Pool, what string, ids []uuid.UUID) {
	t.Helper()
	testkit.WaitFor(t, 20*time.Second, what, func() bool {
		got := handledCounts(t, pool)
		for _, id := range ids {
			if got[id] == 0 {
				return false
			}
		}
		return true
	})
}

func assertExactlyOnce(t testing.TB, pool *pgxpool.Pool, want []uuid.UUID) {
	t.Helper()
	got := handledCounts(t, pool)
	missing, dup := 0, 0
	for _, id := range want {
		switch n := got[id]; {
		case n == 0:
			missing++
		case n > 1:
			dup++
		}
	}
	if missing > 0 || dup > 0 {
		t.Fatalf("of %d events: %d never handled, %d handled more than once", len(want), missing, dup)
	}
}

var _ = fmt.Sprintf

type uuidT = uuid.UUID
