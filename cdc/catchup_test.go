package cdc_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

// TestCatchUpHandsOverFewLargeBatches: a backlog of single-row transactions
// written while the relay was down, and a sink that takes no time. Catching
// up, the stream must hand it full batches (MaxBatchEvents, a thousand
// here): handed over whenever the sink is free, a batch would
// hold only what was read while the sink took the previous one, here a
// transaction or two, and a sink that commits would commit once per
// transaction. Each batch still ends on a whole transaction, and every
// event arrives once, in order.
func TestCatchUpHandsOverFewLargeBatches(t *testing.T) {
	t.Parallel()
	const rows = 20000
	db := pgtest.NewDB(t)
	var mu sync.Mutex
	var batches, events int
	var last uint64
	var order []string
	sink := cdc.SinkFunc(func(_ context.Context, b cdc.Batch) error {
		mu.Lock()
		defer mu.Unlock()
		if b.Partial {
			order = append(order, "a part of a transaction")
		}
		for _, ev := range b.Events {
			if ev.EventType != "caught.up" {
				continue
			}
			if ev.LSN < last {
				order = append(order, "an event before the one handed over last")
			}
			last = ev.LSN
			events++
		}
		if len(b.Events) > 0 {
			batches++
		}
		return nil
	})
	// The first session only starts the stream: its sink records the
	// checkpoint the second one starts from.
	first := startStream(t, baseConfig(t, db), newSink(t, db.Pool))
	testkit.WaitFor(t, 20*time.Second, "first checkpoint", func() bool { return checkpointLSN(t, db.Pool, db.Slot) != 0 })
	if err := first.stop(t); err != nil {
		t.Fatal(err)
	}

	// One transaction per row, with a payload of a kilobyte.
	exec(t, db.Pool, `DO $$
	BEGIN
		FOR i IN 1..20000 LOOP
			INSERT INTO outbox (id, event_type, payload)
			VALUES (gen_random_uuid(), 'caught.up', jsonb_build_object('i', i, 'pad', repeat('x', 1000)));
			COMMIT;
		END LOOP;
	END $$`)
	// The relay comes back once the newest of them is a second old, as
	// after any outage: all of the backlog is behind it.
	time.Sleep(1500 * time.Millisecond)
	// The batch waits for more up to a second here, not 50 ms, so that
	// what is measured is the hold, not how many rows this machine reads
	// in 50 ms beside the rest of the suite.
	cfg := baseConfig(t, db)
	cfg.MaxBatchEvents = 1000
	s, err := cdc.NewStream(cfg, sink)
	if err != nil {
		t.Fatal(err)
	}
	cdc.SetCatchUpWait(s, time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-ran; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	}()
	testkit.WaitFor(t, 120*time.Second, "the backlog handed over", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return events >= rows
	})
	mu.Lock()
	defer mu.Unlock()
	if events != rows || len(order) > 0 {
		t.Fatalf("%d events handed over for %d rows; out of order: %v", events, rows, order)
	}
	t.Logf("%d batches for %d single-row transactions", batches, rows)
	if batches > rows/500 {
		t.Fatalf("the sink got %d batches for %d single-row transactions: %.1f transactions a batch while catching up",
			batches, rows, float64(rows)/float64(batches))
	}
}
