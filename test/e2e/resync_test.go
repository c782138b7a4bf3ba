package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/test/natstest"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

// TestResyncAfterSlotLost: with --on-slot-lost=resync, the slot is dropped
// while producers write; the relay re-creates it after re-reading the
// outbox, and every row committed around the loss starts its saga exactly
// once and reaches the NATS sink (dedupe id = row id). Without the flag the
// relay stops (TestDroppedSlotStopsTheRelay).
func TestResyncAfterSlotLost(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	ns := natstest.Start(t)
	file := filepath.Join(t.TempDir(), "sinks.yaml")
	os.WriteFile(file, []byte(fmt.Sprintf(`sinks:
  - name: bus
    nats: { url: "%s", stream: OUTBOX, subject: "outbox.{aggregate_type}.{event_type}", timeout: 2s }
`, ns.URL())), 0o600)
	p := relaytest.Start(t, nil, relayArgs(db, "--sinks", file, "--on-slot-lost", "resync", "--resync-margin", "1m")...)

	var written atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := writeTrigger(ctx, db); err != nil {
					t.Error(err)
					return
				}
				written.Add(1)
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	time.Sleep(2 * time.Second)
	testkit.WaitFor(t, 30*time.Second, "the slot to be dropped", func() bool {
		db.Pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, db.Slot)
		_, err := db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, db.Slot)
		return err == nil
	})
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	select {
	case <-p.Done():
		t.Fatalf("the relay stopped although --on-slot-lost=resync: %v\n%s", p.ExitErr(), p.Output())
	default:
	}

	triggers := count(t, db, `SELECT count(*) FROM outbox WHERE event_type = 'research_brief.created'`)
	testkit.WaitFor(t, 3*time.Minute, "every trigger row to have its saga", func() bool {
		return count(t, db, `SELECT count(*) FROM outbox o WHERE o.event_type = 'research_brief.created'
			AND NOT EXISTS (SELECT 1 FROM saga_instances i WHERE i.trigger_event_id = o.id)`) == 0
	})
	if n := count(t, db, `SELECT count(*) FROM (SELECT 1 FROM saga_instances GROUP BY trigger_event_id, saga_name HAVING count(*) > 1) d`); n != 0 {
		t.Fatalf("%d trigger rows started more than one saga", n)
	}
	var ids []string
	rows, err := db.Pool.Query(ctx, `SELECT id::text FROM outbox`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		rows.Scan(&id)
		ids = append(ids, id)
	}
	rows.Close()
	var got map[string]int
	testkit.WaitFor(t, 3*time.Minute, "every outbox row in the NATS stream", func() bool {
		got = streamIDs(ns.URL())
		for _, id := range ids {
			if got[id] == 0 {
				return false
			}
		}
		return true
	})
	out := p.Output()
	if !regexp.MustCompile(`level=WARN msg="replication slot lost: re-creating it and re-reading the outbox[^\n]*window="rows created since `).MatchString(out) {
		t.Errorf("no warning with the resync window:\n%s", out)
	}
	if n := count(t, db, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, db.Slot); n != 1 {
		t.Errorf("the slot was not re-created")
	}
	resyncs := regexp.MustCompile(`(?m)^compensa_slot_resyncs_total 1$`)
	testkit.WaitFor(t, 10*time.Second, "compensa_slot_resyncs_total 1", func() bool { return resyncs.MatchString(metrics(t, p.Addr)) })
	deliveries := 0
	for _, c := range got {
		deliveries += c
	}
	p.Stop(30 * time.Second)

	// A relay started while its slot is gone: it resyncs at start too.
	db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, db.Slot)
	var late []uuid.UUID
	for range 20 {
		late = append(late, createBrief(t, db, "written while no relay and no slot", true))
	}
	p = relaytest.Start(t, nil, relayArgs(db, "--sinks", file, "--on-slot-lost", "resync", "--resync-margin", "1m")...)
	testkit.WaitFor(t, time.Minute, "the sagas of the rows written while the slot was gone", func() bool {
		for _, ev := range late {
			if instancesFor(t, db, ev) != 1 {
				return false
			}
		}
		return true
	})
	p.Stop(30 * time.Second)
	t.Logf("resync: %d producer transactions, %d trigger rows, %d outbox rows, %d NATS deliveries (%d again), slot dropped %s before the end of the load",
		written.Load(), triggers, len(ids), deliveries, deliveries-len(got), 3*time.Second)
}

func metrics(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func writeTrigger(ctx context.Context, db *pgtest.DB) error {
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	brief, tenant := uuid.New(), uuid.New()
	if _, err := tx.Exec(ctx, `INSERT INTO research_briefs (id, tenant_id, title, body) VALUES ($1, $2, 'Resync', 'A brief written while the slot is lost.')`,
		brief, tenant); err != nil {
		return err
	}
	if err := outbox.Write(ctx, tx, outbox.Message{TenantID: tenant, AggregateType: "research_brief",
		AggregateID: brief.String(), EventType: "research_brief.created",
		Payload: map[string]string{"brief_id": brief.String()}}); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// streamIDs counts the messages of the OUTBOX stream by dedupe id.
func streamIDs(url string) map[string]int {
	out := map[string]int{}
	nc, err := nats.Connect(url)
	if err != nil {
		return out
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, "OUTBOX")
	if err != nil {
		return out
	}
	info, err := st.Info(ctx)
	if err != nil {
		return out
	}
	for seq := uint64(1); seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			continue
		}
		out[m.Header.Get(jetstream.MsgIDHeader)]++
	}
	return out
}
