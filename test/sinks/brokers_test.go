package sinks

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/rabbittest"
	"github.com/compensa/compensa/test/redistest"
	"github.com/compensa/compensa/test/relaytest"
)

// brokerOutage is one broker under the outage test: the sinks file's entry
// for it, the environment holding its password, how to kill it with -9 and
// start it again, and how to read what it holds, in its order.
type brokerOutage struct {
	name    string
	sink    string // the sink's YAML mapping, after "- name: <name>"
	env     []string
	kill    func()
	restart func(t *testing.T)
	read    func(t *testing.T) []string
	// pace is the pause between the producer's transactions: long enough
	// that both broker restarts fall within the load.
	pace time.Duration
	// exactlyOnce: the broker itself drops a resend (Redis's dedupe key), so
	// every committed id is there once, not at least once.
	exactlyOnce bool
}

// runBrokerOutage commits events over aggs aggregates (some transactions
// rolled back) through the relay binary while the broker is killed -9 and
// started again twice and the relay is killed -9 once, then checks what the
// broker holds: every committed event, by its id, first occurrences in
// commit order per aggregate, nothing rolled back.
func runBrokerOutage(t *testing.T, b brokerOutage, events, aggs int) {
	db := pgtest.NewDB(t)
	file := filepath.Join(t.TempDir(), "sinks.yaml")
	os.WriteFile(file, []byte(fmt.Sprintf("sinks:\n  - name: %s\n    %s\n", b.name, b.sink)), 0o600)
	args := []string{"--database-url", db.URL, "--slot", db.Slot, "--publication", db.Publication, "--status-interval", "200ms",
		"--heartbeat-interval", "1s", "--workers", "1", "--sinks", file}
	p := relaytest.Start(t, b.env, args...)

	var mu sync.Mutex
	var committed, rolledBack []string
	aggOf := map[string]int{}
	progress := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(committed)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx := context.Background()
		for i := 0; progress() < events; i++ {
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			var msgs []outbox.Message
			for j := range 1 + rand.IntN(3) {
				msgs = append(msgs, outbox.Message{AggregateType: "order", AggregateID: fmt.Sprintf("a-%d", (i*3+j)%aggs),
					EventType: "order.changed", Payload: map[string]int{"i": i, "j": j}})
			}
			if err := outbox.Write(ctx, tx, msgs...); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			if rand.IntN(10) == 0 {
				tx.Rollback(ctx)
				for _, m := range msgs {
					rolledBack = append(rolledBack, m.ID.String())
				}
			} else if err := tx.Commit(ctx); err == nil {
				for j, m := range msgs {
					committed = append(committed, m.ID.String())
					aggOf[m.ID.String()] = (i*3 + j) % aggs
				}
			}
			mu.Unlock()
			time.Sleep(b.pace)
		}
	}()

	waitCommitted := func(n int) {
		for progress() < n {
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	// The broker starts again in the background (RabbitMQ takes seconds),
	// so that events keep being committed, and the relay killed, while it
	// is away.
	restarted := make(chan struct{})
	close(restarted)
	killBroker := func(k int) {
		<-restarted
		t.Logf("%s: kill -9 the broker (%d of 2) at %d committed", b.name, k, progress())
		b.kill()
		restarted = make(chan struct{})
		go func(ch chan struct{}) {
			defer close(ch)
			time.Sleep(time.Second)
			b.restart(t)
		}(restarted)
	}
	start := time.Now()
	waitCommitted(events / 10)
	killBroker(1)
	waitCommitted(events * 3 / 10)
	t.Logf("%s: kill -9 the relay at %d committed", b.name, progress())
	p.Kill()
	p = relaytest.Start(t, b.env, args...)
	waitCommitted(events * 11 / 20)
	killBroker(2)
	<-done
	<-restarted
	t.Logf("%s: %d committed, %d rolled back in %s", b.name, len(committed), len(rolledBack), time.Since(start).Round(time.Millisecond))

	var got []string
	deadline := time.Now().Add(90 * time.Second)
	for {
		got = b.read(t)
		if len(firstSeen(got)) >= len(committed) && count(t, db, `SELECT count(*) FROM relay_sink_parked WHERE sink = $1`, b.name) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d of %d committed events in the broker, %d parked after 90s\n%s", b.name, len(firstSeen(got)), len(committed),
				count(t, db, `SELECT count(*) FROM relay_sink_parked WHERE sink = $1`, b.name), tail(p.Output()))
		}
		time.Sleep(300 * time.Millisecond)
	}
	p.Stop(30 * time.Second)

	pos := firstSeen(got)
	isCommitted := map[string]bool{}
	for _, id := range committed {
		isCommitted[id] = true
		if _, ok := pos[id]; !ok {
			t.Errorf("%s: committed event %s is not in the broker", b.name, id)
		}
	}
	for _, id := range rolledBack {
		if _, ok := pos[id]; ok {
			t.Errorf("%s: rolled-back event %s is in the broker", b.name, id)
		}
	}
	for id := range pos {
		if !isCommitted[id] {
			t.Errorf("%s: unknown id %q in the broker", b.name, id)
		}
	}
	last := map[int]int{}
	for _, id := range committed {
		a := aggOf[id]
		if prev, ok := last[a]; ok && pos[id] < prev {
			t.Errorf("%s: aggregate a-%d: event %s first appears before an event committed earlier", b.name, a, id)
			break
		}
		last[a] = pos[id]
	}
	if b.exactlyOnce && len(got) != len(pos) {
		t.Errorf("%s: %d entries for %d events: a replay added entries", b.name, len(got), len(pos))
	}
	t.Logf("%s: %d committed events, %d messages in the broker (%d replays)", b.name, len(committed), len(got), len(got)-len(pos))
}

// TestRabbitMQThroughBrokerAndRelayKills: the operator declared a durable
// topic exchange and a durable queue bound to it (the test does, not the
// relay); 800 events over 60 aggregates are committed while RabbitMQ is
// killed -9 twice and the relay once, and the queue ends up with every
// committed event by message_id, in commit order per aggregate (first
// occurrences: delivery is at least once), none rolled back.
func TestRabbitMQThroughBrokerAndRelayKills(t *testing.T) {
	rb := rabbittest.Start(t)
	conn, err := rb.Dial()
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare("outbox", "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("orders", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("orders", "outbox.order.#", "outbox", false, nil); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	var ids []string
	runBrokerOutage(t, brokerOutage{
		name: "rabbit",
		sink: fmt.Sprintf(`rabbitmq: { url: "%s", password_env: E2E_RABBITMQ_PASSWORD, exchange: outbox, routing_key: "outbox.{aggregate_type}.{event_type}", timeout: 3s }`, rb.URL()),
		env:  []string{"E2E_RABBITMQ_PASSWORD=" + rb.Password},
		kill: rb.Kill, restart: func(t *testing.T) { rb.Restart(t) }, pace: 60 * time.Millisecond,
		// Consumes (with acknowledgement) what arrived since the last read.
		read: func(t *testing.T) []string {
			conn, err := rb.Dial()
			if err != nil {
				return ids
			}
			defer conn.Close()
			ch, err := conn.Channel()
			if err != nil {
				return ids
			}
			for {
				d, ok, err := ch.Get("orders", false)
				if err != nil || !ok {
					return ids
				}
				if d.MessageId == "" {
					t.Errorf("a message without message_id: %s", d.Body)
				}
				ids = append(ids, d.MessageId)
				d.Ack(false)
			}
		},
	}, outageEvents(), 60)
}

// outageEvents is how many events the broker outage tests commit: 800,
// 3,000 in the full run (make test-sinks).
func outageEvents() int {
	if full {
		return 3000
	}
	return 800
}

// TestRedisStreamsThroughServerAndRelayKills: the same with Redis
// (appendonly, appendfsync always, as a deployment that wants the
// guarantee runs it), killed -9 twice and the relay once; the stream ends
// up with every committed event exactly once (the dedupe key turns the
// replays into no-ops), in commit order per aggregate.
func TestRedisStreamsThroughServerAndRelayKills(t *testing.T) {
	rs := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: rs.Addr(), Password: rs.Password})
	defer c.Close()
	runBrokerOutage(t, brokerOutage{
		name: "streams",
		sink: fmt.Sprintf(`redis: { url: "%s", password_env: E2E_REDIS_PASSWORD, stream: "outbox.{aggregate_type}", maxlen: 100000, timeout: 2s }`, rs.URL()),
		env:  []string{"E2E_REDIS_PASSWORD=" + rs.Password},
		kill: rs.Kill, restart: func(t *testing.T) { rs.Restart(t) }, pace: 25 * time.Millisecond,
		read: func(t *testing.T) []string {
			xs, err := c.XRange(context.Background(), "outbox.order", "-", "+").Result()
			if err != nil {
				return nil
			}
			ids := make([]string, len(xs))
			for i, x := range xs {
				ids[i], _ = x.Values["id"].(string)
			}
			return ids
		},
		exactlyOnce: true,
	}, outageEvents(), 60)
}
