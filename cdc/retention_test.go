package cdc_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

// insertAged commits n outbox rows whose created_at lies age in the past.
func insertAged(t *testing.T, db *pgtest.DB, n int, eventType string, age time.Duration) []uuid.UUID {
	t.Helper()
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = uuid.New()
	}
	exec(t, db.Pool, `INSERT INTO outbox (id, event_type, payload, created_at)
		SELECT id, $2, '{}', now() - $3 * interval '1 microsecond' FROM unnest($1::uuid[]) id`, ids, eventType, age.Microseconds())
	return ids
}

func stillInOutbox(t *testing.T, db *pgtest.DB, ids []uuid.UUID) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE id = ANY($1)`, ids).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Retention deletes rows older than Retention once they are handled, and
// never a row the sink has not committed, however old its created_at says it
// is. Younger rows stay.
func TestRetentionDeletesOnlyHandledRows(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	sink := newSink(t, db.Pool)
	release := make(chan struct{})
	held := make(chan struct{}, 1)
	sink.setBefore(func(ctx context.Context, b cdc.Batch) error {
		if len(b.Events) == 0 || b.Events[0].EventType != "held" {
			return nil
		}
		select {
		case held <- struct{}{}:
		default:
		}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	cfg := baseConfig(t, db)
	cfg.Retention = time.Hour
	cfg.RetentionInterval = 100 * time.Millisecond
	cfg.RetentionBatchSize = 7
	startStream(t, cfg, sink)
	testkit.WaitFor(t, 20*time.Second, "first checkpoint", func() bool { return checkpointLSN(t, db.Pool, db.Slot) != 0 })

	old := insertAged(t, db, 20, "old", 2*time.Hour)
	young := writeEvents(t, db.Pool, 5, "young")
	testkit.WaitFor(t, 20*time.Second, "old handled rows deleted", func() bool { return stillInOutbox(t, db, old) == 0 })
	// The young rows commit in a transaction of their own, which can reach
	// the sink after the old rows are already deleted.
	waitHandled(t, db.Pool, "the young rows handled", young)
	assertExactlyOnce(t, db.Pool, append(append([]uuid.UUID(nil), old...), young...))

	// A row that claims to be two days old but is not handled yet.
	unhandled := insertAged(t, db, 3, "held", 48*time.Hour)
	<-held
	time.Sleep(15 * cfg.RetentionInterval)
	if n := stillInOutbox(t, db, unhandled); n != 3 {
		t.Fatalf("retention deleted %d rows the sink had not handled", 3-n)
	}
	close(release)
	testkit.WaitFor(t, 20*time.Second, "the held rows, handled, deleted", func() bool { return stillInOutbox(t, db, unhandled) == 0 })
	if n := stillInOutbox(t, db, young); n != len(young) {
		t.Fatalf("retention deleted %d rows younger than the retention", len(young)-n)
	}
}
