package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

// A deployment migrates with --create-slot, the application writes before the
// relay ever runs, and keeps writing while it starts: every row starts
// exactly one saga.
func TestRowsWrittenBeforeTheFirstRunAreHandled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewEmptyDB(t)

	out, code := relaytest.Run(t, nil, "migrate", "--with-examples", "--create-slot",
		"--database-url", db.URL, "--slot", db.Slot, "--publication", db.Publication)
	if code != 0 || !strings.Contains(out, "slot "+db.Slot) {
		t.Fatalf("migrate --create-slot: code %d\n%s", code, out)
	}
	pool, err := pgtest.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	db.Pool = pool

	var mu sync.Mutex
	var events []uuid.UUID
	add := func(e uuid.UUID) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}
	for i := 0; i < 300; i++ {
		add(createBrief(t, db, fmt.Sprintf("before the relay %d", i), true))
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the application keeps writing while the relay starts
		defer wg.Done()
		for i := 0; i < 200; i++ {
			add(createBrief(t, db, fmt.Sprintf("during start %d", i), true))
		}
	}()
	p := relaytest.Start(t, nil, relayArgs(db)...)
	wg.Wait()
	testkit.WaitFor(t, 60*time.Second, "500 sagas", func() bool {
		return count(t, db, `SELECT count(*) FROM saga_instances`) == 500
	})
	if n := count(t, db, `SELECT count(*) FROM saga_instances i JOIN outbox o ON o.id = i.trigger_event_id
		WHERE o.event_type = 'research_brief.created'`); n != 500 {
		t.Fatalf("%d instances match a trigger row, want 500", n)
	}
	for _, e := range events {
		if n := instancesFor(t, db, e); n != 1 {
			t.Fatalf("event %s started %d sagas", e, n)
		}
	}
	p.Stop(30 * time.Second)
}
