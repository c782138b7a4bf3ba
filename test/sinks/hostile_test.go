package sinks

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/compensa/compensa/correlator"
	"github.com/compensa/compensa/migrations"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/relay"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/sink/webhook"
	"github.com/compensa/compensa/test/natstest"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/rabbittest"
	"github.com/compensa/compensa/test/redistest"
	"github.com/compensa/compensa/test/testkit"
)

// brokerLimit is the NATS server's max_payload, the Kafka sink's
// max_message_bytes and RabbitMQ's max_message_size (the sink's
// max_message_bytes too) in the hostile-row tests: a payload above it is
// larger than the broker takes.
const brokerLimit = 256 << 10

// redisBulkLimit is the Redis server's proto-max-bulk-len in the
// hostile-row tests, the smallest Redis allows: a payload above it is
// larger than Redis reads in one value.
const redisBulkLimit = 1 << 20

// hostileTable is a producer's own outbox table, as loose as PostgreSQL
// lets it be: every column may be NULL.
const hostileTable = `CREATE TABLE hostile_outbox (
	seq bigserial PRIMARY KEY, id text, tenant_id text, aggregate_type text, aggregate_id text,
	event_type text, payload jsonb, headers jsonb, created_at timestamptz DEFAULT now())`

// hostileRelay is a relay streaming hostile_outbox with a declared saga
// (started by order.placed) and sinks that select every event: a webhook
// ("hook"), NATS JetStream ("bus"), Kafka ("kafka"), and RabbitMQ
// ("rabbit") and Redis Streams ("streams") when they are installed.
type hostileRelay struct {
	db    *pgtest.DB
	ep    *endpoint
	nats  string
	kafka []string
	*hostileBrokers
	sinks []string // the sinks' names
	logs  *logCounter
}

// hostileBrokers are the RabbitMQ node and the Redis server of a
// hostile-row test, each nil when it is not installed (outside CI), and
// what was consumed from RabbitMQ so far.
type hostileBrokers struct {
	rabbit *rabbittest.Server
	redis  *redistest.Server
	// name is the test's own exchange, queue and stream prefix on the
	// shared servers.
	name      string
	mu        sync.Mutex
	rabbitGot delivered
}

// hostileRabbit is the RabbitMQ node of the hostile-row tests, shared by
// them: its max_message_size is brokerLimit, like the other brokers'
// limits. It boots while the first test that needs it sets up PostgreSQL
// and the relay (a node takes seconds to boot).
var hostileRabbit testkit.Shared[*rabbittest.Server]

// launchHostileBrokers launches RabbitMQ and Redis, when installed, for a
// hostile-row test (in CI a missing one fails the test, as everywhere).
// Redis is the binary's shared server, its proto-max-bulk-len lowered to
// redisBulkLimit: each test has streams of its own on it.
func launchHostileBrokers(t *testing.T) *hostileBrokers {
	t.Helper()
	b := &hostileBrokers{rabbitGot: delivered{poison: map[string]string{}}}
	if testkit.HaveTool(t, rabbittest.Missing()) {
		b.rabbit = hostileRabbit.Get(t, "hostile-rabbit", func(dir string) (*rabbittest.Server, error) {
			return rabbittest.Launch(dir, fmt.Sprintf("max_message_size = %d", brokerLimit))
		})
	}
	if testkit.HaveTool(t, redistest.Missing()) {
		b.redis = redistest.Shared(t)
		c := redis.NewClient(&redis.Options{Addr: b.redis.Addr(), Password: b.redis.Password})
		defer c.Close()
		if err := c.ConfigSet(context.Background(), "proto-max-bulk-len", fmt.Sprint(redisBulkLimit)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// logCounter keeps the relay's logs that say a batch or the stream failed
// (a failed batch ends the replication session), and those that say a
// sink is down.
type logCounter struct {
	rec   *logRecords
	attrs string // from WithAttrs (the sink's name among them)
}

type logRecords struct {
	mu           sync.Mutex
	failed, down []string
}

func newLogCounter() *logCounter { return &logCounter{rec: &logRecords{}} }

func (l *logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (l *logCounter) Handle(_ context.Context, r slog.Record) error {
	msg := r.Message
	r.Attrs(func(a slog.Attr) bool { msg += " " + a.String(); return true })
	l.rec.mu.Lock()
	defer l.rec.mu.Unlock()
	if r.Level >= slog.LevelWarn && (strings.Contains(msg, "replication session ended") || strings.Contains(msg, "stream cannot go on") ||
		strings.Contains(msg, "encode parked") || strings.Contains(msg, "batch") && strings.Contains(msg, "fail")) {
		l.rec.failed = append(l.rec.failed, msg)
	}
	if strings.HasPrefix(r.Message, "sink is down") {
		l.rec.down = append(l.rec.down, msg+l.attrs)
	}
	return nil
}
func (l *logCounter) WithAttrs(as []slog.Attr) slog.Handler {
	c := *l
	for _, a := range as {
		c.attrs += " " + a.String()
	}
	return &c
}
func (l *logCounter) WithGroup(string) slog.Handler { return l }
func (l *logCounter) failures() []string {
	l.rec.mu.Lock()
	defer l.rec.mu.Unlock()
	return append([]string(nil), l.rec.failed...)
}

// sinkDown returns the "sink is down" logs of the sink named name.
func (l *logCounter) sinkDown(name string) []string {
	l.rec.mu.Lock()
	defer l.rec.mu.Unlock()
	var out []string
	for _, m := range l.rec.down {
		if strings.Contains(m, " sink="+name) {
			out = append(out, m)
		}
	}
	return out
}

func startHostileRelay(t *testing.T, db *pgtest.DB, brokers *hostileBrokers) *hostileRelay {
	t.Helper()
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, hostileTable); err != nil {
		t.Fatal(err)
	}
	ns := natstest.Start(t, func(o *server.Options) { o.MaxPayload = brokerLimit })
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(3))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	h := &hostileRelay{db: db, ep: newEndpoint(t), nats: ns.URL(), kafka: kc.ListenAddrs(), hostileBrokers: brokers,
		sinks: []string{"hook", "bus", "kafka"}, logs: newLogCounter()}
	h.name = "hostile_" + db.Name

	dir := t.TempDir()
	sagas := filepath.Join(dir, "sagas")
	os.Mkdir(sagas, 0o700)
	os.WriteFile(filepath.Join(sagas, "placed.yaml"), []byte(`saga: hostile_watch
version: 1
triggers:
  - event_type: order.placed
steps:
  - name: note
    sql:
      query: SELECT 1
`), 0o600)
	sinks := filepath.Join(dir, "sinks.yaml")
	file := fmt.Sprintf(`sinks:
  - name: hook
    webhook: { url: "%s/events", secret_env: HOSTILE_WEBHOOK_SECRET, timeout: 5s }
  - name: bus
    nats: { url: "%s", stream: OUTBOX, subject: "outbox.{aggregate_type}.{event_type}", timeout: 5s }
  - name: kafka
    kafka: { brokers: ["%s"], topic: "outbox.event.{aggregate_type}", timeout: 5s, max_message_bytes: %d }
`, h.ep.srv.URL, h.nats, h.kafka[0], brokerLimit)
	if h.rabbit != nil {
		file += fmt.Sprintf(`  - name: rabbit
    rabbitmq: { url: "%s", password_env: HOSTILE_RABBITMQ_PASSWORD, exchange: %s, routing_key: "outbox.{aggregate_type}.{event_type}", timeout: 10s, max_message_bytes: %d }
`, h.rabbit.URL(), h.name, brokerLimit)
		t.Setenv("HOSTILE_RABBITMQ_PASSWORD", h.rabbit.Password)
		h.sinks = append(h.sinks, "rabbit")
	}
	if h.redis != nil {
		file += fmt.Sprintf(`  - name: streams
    redis: { url: "%s", password_env: HOSTILE_REDIS_PASSWORD, stream: "%s.{aggregate_type}", timeout: 10s }
`, h.redis.URL(), h.name)
		t.Setenv("HOSTILE_REDIS_PASSWORD", h.redis.Password)
		h.sinks = append(h.sinks, "streams")
	}
	os.WriteFile(sinks, []byte(file), 0o600)
	t.Setenv("HOSTILE_WEBHOOK_SECRET", secret)
	r, err := relay.New(ctx, relay.Config{DatabaseURL: db.URL, Registry: saga.NewRegistry(), Slot: db.Slot, Publication: db.Publication,
		OutboxTable: "hostile_outbox", Sagas: sagas, Sinks: sinks, Workers: 1, Logger: slog.New(h.logs),
		StatusInterval: 100 * time.Millisecond, HeartbeatInterval: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := r.Stop(sctx); err != nil {
			t.Error(err)
		}
	})
	testkit.WaitFor(t, 30*time.Second, "the first checkpoint", func() bool {
		return count(t, db, `SELECT count(*) FROM relay_checkpoints WHERE slot_name = $1`, db.Slot) == 1
	})
	if h.rabbit != nil {
		// The sink connects on its first delivery, after this: the node and
		// the operator's exchange and queue must be there by then.
		if err := h.rabbit.Ready(); err != nil {
			t.Fatal(err)
		}
		h.declareRabbit(t)
	}
	return h
}

// declareRabbit declares what the operator would: a durable topic exchange
// and a durable queue bound to it for every routing key.
func (h *hostileRelay) declareRabbit(t *testing.T) {
	conn, err := h.rabbit.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(h.name, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(h.name, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(h.name, "#", h.name, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if conn, err := h.rabbit.Dial(); err == nil {
			if ch, err := conn.Channel(); err == nil {
				ch.QueueDelete(h.name, false, false, false)
				ch.ExchangeDelete(h.name, false, false)
			}
			conn.Close()
		}
	})
}

// insertRaw writes one row, its columns given as SQL, in a transaction of
// its own over conn.
func insertRaw(t *testing.T, conn *pgx.Conn, cols map[string]string) {
	t.Helper()
	var names, values []string
	for _, c := range []string{"id", "tenant_id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers"} {
		if v, ok := cols[c]; ok {
			names = append(names, c)
			values = append(values, v)
		}
	}
	q := `INSERT INTO hostile_outbox (` + strings.Join(names, ", ") + `) VALUES (` + strings.Join(values, ", ") + `)`
	if _, err := conn.Exec(context.Background(), q); err != nil {
		t.Fatalf("insert %s: %v", q[:min(len(q), 300)], err)
	}
}

func lit(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// normalEvents writes n trigger events over aggs, one transaction each, and
// returns their ids in commit order and the WAL position after the last.
func normalEvents(t *testing.T, db *pgtest.DB, n int, aggs []string) ([]string, map[string]string, pglogrepl.LSN) {
	t.Helper()
	ctx := context.Background()
	var ids []string
	aggOf := map[string]string{}
	for i := range n {
		id := uuid.NewString()
		agg := aggs[i%len(aggs)]
		if _, err := db.Pool.Exec(ctx, `INSERT INTO hostile_outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
			VALUES ($1, 'order', $2, 'order.placed', $3, '{"trace":"t"}')`, id, agg, fmt.Sprintf(`{"n":%d}`, i)); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		aggOf[id] = agg
	}
	var s string
	if err := db.Pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	lsn, _ := pglogrepl.ParseLSN(s)
	return ids, aggOf, lsn
}

// delivered is what one sink received: ids in arrival order and, per id,
// the poison reason it carried.
type delivered struct {
	order  []string
	poison map[string]string
}

func (h *hostileRelay) received(t *testing.T) map[string]delivered {
	out := map[string]delivered{}
	// Webhook: arrival order; the envelope says poison.
	hook := delivered{order: h.ep.ids(), poison: map[string]string{}}
	for _, id := range hook.order {
		h.ep.mu.Lock()
		body := h.ep.bodies[id]
		h.ep.mu.Unlock()
		var env envelope
		if json.Unmarshal(body, &env) == nil && env.Poison != "" {
			hook.poison[id] = env.Poison
		}
	}
	out["hook"] = hook
	// NATS: stream order; the "poison" header.
	bus := delivered{poison: map[string]string{}}
	if nc, err := nats.Connect(h.nats, nats.Timeout(2*time.Second)); err == nil {
		js, _ := jetstream.New(nc)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		if st, err := js.Stream(ctx, "OUTBOX"); err == nil {
			if info, err := st.Info(ctx); err == nil {
				for seq := uint64(1); seq <= info.State.LastSeq; seq++ {
					m, err := st.GetMsg(ctx, seq)
					if err != nil {
						continue
					}
					id := m.Header.Get(jetstream.MsgIDHeader)
					bus.order = append(bus.order, id)
					if p := m.Header.Get("poison"); p != "" {
						bus.poison[id] = p
					}
				}
			}
		}
		cancel()
		nc.Close()
	}
	out["bus"] = bus
	// Kafka: every partition from the start; order holds per partition,
	// which is per aggregate.
	kf := delivered{poison: map[string]string{}}
	if cl, err := kgo.NewClient(kgo.SeedBrokers(h.kafka...), kgo.ConsumeRegex(), kgo.ConsumeTopics("outbox\\..*"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())); err == nil {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
			fs := cl.PollFetches(ctx)
			cancel()
			n := 0
			fs.EachRecord(func(rec *kgo.Record) {
				n++
				var id, poison string
				for _, hd := range rec.Headers {
					switch hd.Key {
					case "id":
						id = string(hd.Value)
					case "poison":
						poison = string(hd.Value)
					}
				}
				kf.order = append(kf.order, id)
				if poison != "" {
					kf.poison[id] = poison
				}
			})
			if n == 0 {
				break
			}
		}
		cl.Close()
	}
	out["kafka"] = kf
	// RabbitMQ: queue order, consumed (and acknowledged) as it arrives; the
	// "poison" header.
	if h.rabbit != nil {
		h.mu.Lock()
		if conn, err := h.rabbit.Dial(); err == nil {
			if ch, err := conn.Channel(); err == nil {
				for {
					d, ok, err := ch.Get(h.name, false)
					if err != nil || !ok {
						break
					}
					h.rabbitGot.order = append(h.rabbitGot.order, d.MessageId)
					if p, _ := d.Headers["poison"].(string); p != "" {
						h.rabbitGot.poison[d.MessageId] = p
					}
					d.Ack(false)
				}
			}
			conn.Close()
		}
		out["rabbit"] = delivered{order: append([]string(nil), h.rabbitGot.order...), poison: maps.Clone(h.rabbitGot.poison)}
		h.mu.Unlock()
	}
	// Redis: stream order; the "poison" field.
	if h.redis != nil {
		st := delivered{poison: map[string]string{}}
		c := redis.NewClient(&redis.Options{Addr: h.redis.Addr(), Password: h.redis.Password})
		xs, _ := c.XRange(context.Background(), h.name+".order", "-", "+").Result()
		c.Close()
		for _, x := range xs {
			id, _ := x.Values["id"].(string)
			st.order = append(st.order, id)
			if p, _ := x.Values["poison"].(string); p != "" {
				st.poison[id] = p
			}
		}
		out["streams"] = st
	}
	return out
}

// parked returns sink → event_id → reason of relay_sink_parked.
func parkedReasons(t *testing.T, db *pgtest.DB) map[string]map[string]string {
	rows, err := db.Pool.Query(context.Background(), `SELECT sink, event_id, reason FROM relay_sink_parked`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]string{}
	var s, id, reason string
	if _, err := pgx.ForEachRow(rows, []any{&s, &id, &reason}, func() error {
		if out[s] == nil {
			out[s] = map[string]string{}
		}
		out[s][id] = reason
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkHostile runs the scenario: the hostile rows, then normal events over
// the aggregates the hostile rows share; every normal event starts its
// saga and reaches every sink in order per aggregate, the slot passes
// everything, and each hostile row is a dead letter (when it is poison)
// and in every sink delivered as poison or parked with a reason.
//
// The webhook endpoint is down while the hostile rows are written, so that
// the webhook sink parks every one of them; it is back before the normal
// events, which drain behind them. wantRaw is how many of the parked rows
// must be kept in event_raw, as jsonb cannot hold them as they are (a
// payload or headers value that is poison is kept in base64 in event).
func checkHostile(t *testing.T, h *hostileRelay, conn *pgx.Conn, rows []hostileCase, wantRaw int) {
	t.Helper()
	ctx := context.Background()
	db := h.db
	h.ep.status.Store(503)
	for _, r := range rows {
		insertRaw(t, conn, r.cols)
	}
	_, _, hostileEnd := normalEvents(t, db, 0, nil)
	testkit.WaitFor(t, 60*time.Second, "the slot to pass the hostile rows while the webhook is down", func() bool {
		return confirmedFlush(t, db) >= hostileEnd
	})
	parked := parkedReasons(t, db)["hook"]
	for _, r := range rows {
		if r.parkedReason(parked) == "" {
			t.Errorf("%s: not parked by the webhook sink while its endpoint is down", r.name)
		}
	}
	if n := count(t, db, `SELECT count(*) FROM relay_sink_parked WHERE sink = 'hook' AND event_raw IS NOT NULL AND event->>'in_event_raw' = 'true'`); n != wantRaw {
		t.Errorf("%d parked events kept in event_raw, want %d", n, wantRaw)
	}
	h.ep.status.Store(0)
	ids, aggOf, lsn := normalEvents(t, db, 24, []string{"h-1", "n-1", "n-2"})
	testkit.WaitFor(t, 60*time.Second, "the slot to pass the hostile rows and the events after them", func() bool {
		return confirmedFlush(t, db) >= lsn
	})
	testkit.WaitFor(t, 60*time.Second, "every normal event to start its saga", func() bool {
		return count(t, db, `SELECT count(*) FROM saga_instances WHERE saga_name = 'hostile_watch' AND trigger_event_id::text = ANY($1)`, ids) == len(ids)
	})
	var got map[string]delivered
	missing := map[string][]string{}
	deadline := time.Now().Add(60 * time.Second)
	for {
		got = h.received(t)
		missing = map[string][]string{}
		for s, d := range got {
			seen := firstSeen(d.order)
			for _, id := range ids {
				if _, ok := seen[id]; !ok {
					missing[s] = append(missing[s], aggOf[id])
				}
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			rows, _ := db.Pool.Query(ctx, `SELECT sink, left(event_id, 60), aggregate_key, left(reason, 200), attempts FROM relay_sink_parked ORDER BY seq`)
			for rows.Next() {
				var s, id, k, reason string
				var n int
				rows.Scan(&s, &id, &k, &reason, &n)
				t.Logf("parked: %s %s %.60s %d %s", s, id, k, n, reason)
			}
			rows.Close()
			t.Fatalf("normal events missing in the sinks (by aggregate): %v", missing)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for name, d := range got {
		pos := firstSeen(d.order)
		last := map[string]int{}
		for _, id := range ids {
			if p, ok := last[aggOf[id]]; ok && pos[id] < p {
				t.Errorf("sink %s: aggregate %s out of order at %s", name, aggOf[id], id)
			}
			last[aggOf[id]] = pos[id]
		}
	}
	dead := map[string]string{}
	cor, err := correlator.New(db.Pool, &correlator.Config{Registry: saga.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	list, err := cor.ListDeadLetters(ctx, false, 1000) // what `relay deadletters list` shows
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range list {
		var raw map[string]any
		json.Unmarshal(d.Raw, &raw)
		k := d.EventID
		if agg, _ := raw["aggregate_id"].(string); strings.HasPrefix(d.EventID, "(no id)") {
			k = agg
		}
		dead[k] = d.Reason
	}
	// Parked rows and deliveries for the hostile rows may still be in
	// flight in another transaction: wait until each is accounted for.
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			if r.deadLetter {
				reason, ok := dead[r.deadKey()]
				if !ok || reason == "" || !strings.Contains(reason, r.poison) {
					t.Errorf("dead letter: %q (present %v), want a reason with %q", reason, ok, r.poison)
				}
			} else if _, ok := dead[r.deadKey()]; ok {
				t.Errorf("a usable row is a dead letter: %s", dead[r.deadKey()])
			}
			if n := count(t, db, `SELECT count(*) FROM saga_instances WHERE trigger_event_id = $1`, outbox.EventIDFromText(r.id)); r.starts && n != 1 {
				t.Errorf("the trigger started %d sagas, want 1", n)
			}
			var where map[string]string
			testkit.WaitFor(t, 30*time.Second, "the row delivered or parked in every sink", func() bool {
				got := h.received(t)
				parked := parkedReasons(t, db)
				where = map[string]string{}
				for _, s := range h.sinks {
					if reason := r.parkedReason(parked[s]); reason != "" {
						where[s] = "parked: " + reason
						continue
					}
					id := r.id
					switch s {
					case "hook":
						id = webhook.HeaderID(id) // the endpoint records webhook-id
					case "bus":
						// A NATS header value holds no line break: the
						// client sends a space, which is what dedupes.
						id = strings.TrimSpace(strings.NewReplacer("\r", " ", "\n", " ").Replace(id))
					}
					if _, ok := firstSeen(got[s].order)[id]; ok {
						where[s] = "delivered; poison: " + got[s].poison[id]
					}
				}
				return len(where) == len(h.sinks)
			})
			for s, w := range where {
				t.Logf("%s: %.160s", s, w)
				switch {
				case strings.HasPrefix(w, "parked: "):
					if r.parked != nil && !strings.Contains(w, r.parked[s]) {
						t.Errorf("sink %s: %.200s, want a reason with %q", s, w, r.parked[s])
					}
				case r.poison != "" && !strings.Contains(w, r.poison):
					t.Errorf("sink %s delivered the row without its poison reason: %.200s", s, w)
				}
				if want, ok := r.parked[s]; ok && want != "" && !strings.HasPrefix(w, "parked: ") {
					t.Errorf("sink %s: %.200s, want it parked (%s)", s, w, want)
				}
				if strictSinks[s] && r.parked[s] == "" && strings.HasPrefix(w, "parked: ") {
					t.Errorf("sink %s: %.200s, want it delivered", s, w)
				}
			}
		})
	}
	if f := h.logs.failures(); len(f) > 0 {
		t.Errorf("the relay logged %d failed batches, first: %.300s", len(f), f[0])
	}
	// What a broker cannot take is a refusal of its event, parked with the
	// reason: never an outage, which would hold every event of the sink
	// and retry for ever. Deliverable events arrive once each. (The
	// webhook, down on purpose, shows that the logs are seen.)
	if len(h.logs.sinkDown("hook")) == 0 {
		t.Errorf(`no "sink is down" log of the webhook sink, whose endpoint answered 503`)
	}
	got = h.received(t)
	for _, s := range h.sinks {
		if !strictSinks[s] {
			continue
		}
		if down := h.logs.sinkDown(s); len(down) > 0 {
			t.Errorf("sink %s went down %d times, first: %.300s", s, len(down), down[0])
		}
		n := map[string]int{}
		for _, id := range got[s].order {
			n[id]++
		}
		for id, k := range n {
			if k > 1 {
				t.Errorf("sink %s: %.80q delivered %d times, want once", s, id, k)
			}
		}
	}
}

// strictSinks are the hostile-row tests' sinks whose deliverable events
// must each arrive exactly once, never parked and without the sink going
// down: the brokers whose hostile rows this checks beyond "delivered or
// parked" (the webhook is down on purpose meanwhile).
var strictSinks = map[string]bool{"rabbit": true, "streams": true}

// hostileCase is one hostile row: its columns as SQL and what must become
// of it.
type hostileCase struct {
	name string
	cols map[string]string
	// id is the row's id (empty for a row without one, then agg names it).
	id, agg    string
	deadLetter bool
	starts     bool              // a usable trigger: it must start its saga
	poison     string            // in the dead letter's reason and in what the sinks carry
	parked     map[string]string // sink → part of the reason it must be parked with
}

func (c *hostileCase) deadKey() string {
	if c.id == "" {
		return c.agg
	}
	return c.id
}

// parkedReason finds the row in one sink's parked rows (event_id → reason):
// event_id is the id, clipped when long; a row without an id is numbered
// within its transaction.
func (c *hostileCase) parkedReason(parked map[string]string) string {
	if reason, ok := parked[c.id]; ok && c.id != "" {
		return reason
	}
	prefix := "(no id) "
	if c.id != "" {
		if len(c.id) <= 1000 {
			return ""
		}
		prefix = c.id[:900]
	}
	for id, reason := range parked {
		if strings.HasPrefix(id, prefix) {
			return reason
		}
	}
	return ""
}

func hostileCases() []hostileCase {
	deep := strings.Repeat("[", 12000) + strings.Repeat("]", 12000)
	// Larger than every broker takes, Redis's proto-max-bulk-len included.
	big := strings.Repeat("x", redisBulkLimit+brokerLimit)
	longID := strings.Repeat("i", 5000)
	mk := func(name, agg, payload, headers string) hostileCase {
		id := uuid.NewString()
		return hostileCase{name: name, id: id, agg: agg, cols: map[string]string{"id": lit(id), "aggregate_type": "'order'",
			"aggregate_id": lit(agg), "event_type": "'order.placed'", "payload": payload, "headers": headers}}
	}
	deepPayload := mk("payload_nested_12000_deep", "h-1", lit(deep)+"::jsonb", "'{}'")
	deepPayload.deadLetter, deepPayload.poison = true, "nests 12000 levels deep"
	deepHeaders := mk("headers_nested_12000_deep", "h-1", `'{"n":1}'`, lit(deep)+"::jsonb")
	deepHeaders.deadLetter, deepHeaders.poison = true, "headers nests 12000 levels deep"
	deepObject := mk("payload_objects_12000_deep", "h-1", lit(strings.Repeat(`{"a":`, 12000)+"1"+strings.Repeat("}", 12000))+"::jsonb", "NULL")
	deepObject.deadLetter, deepObject.poison = true, "nests 12000 levels deep"
	nullPayload := mk("payload_null", "h-1", "NULL", "NULL")
	nullPayload.deadLetter, nullPayload.poison = true, "payload is null"
	nullType := mk("event_type_null", "h-1", `'{"n":1}'`, "'{}'")
	nullType.cols["event_type"] = "NULL"
	nullType.deadLetter, nullType.poison = true, "event_type is null"
	noID := mk("id_null", "nil-1", `'{"n":1}'`, "'{}'")
	noID.id, noID.cols["id"] = "", "NULL"
	noID.deadLetter, noID.poison = true, "id is null"
	const held = "held: the row has no id"
	noID.parked = map[string]string{"hook": held, "bus": held, "kafka": held, "rabbit": held, "streams": held}
	tooBig := mk("payload_larger_than_the_brokers_take", "big-1", lit(`{"blob":"`+big+`"}`), "'{}'")
	tooBig.cols["event_type"] = "'order.noted'"
	tooBig.parked = map[string]string{"bus": "max_payload", "kafka": "max_message_bytes", "rabbit": "max_message_bytes", "streams": "proto-max-bulk-len"}
	bigHeaders := mk("headers_larger_than_the_brokers_take", "big-2", `'{"n":1}'`, lit(`{"blob":"`+big+`"}`))
	bigHeaders.cols["event_type"] = "'order.noted'"
	bigHeaders.parked = map[string]string{"bus": "max_payload", "kafka": "max_message_bytes", "rabbit": "max_message_bytes", "streams": "proto-max-bulk-len"}
	// Headers within every broker's limit but larger than an AMQP frame,
	// which carries a message's properties and headers whole (frame_max
	// 128 KiB by default).
	frameHeaders := mk("headers_larger_than_an_amqp_frame", "frame-1", `'{"n":1}'`, lit(`{"blob":"`+strings.Repeat("f", 150<<10)+`"}`))
	frameHeaders.cols["event_type"] = "'order.noted'"
	frameHeaders.parked = map[string]string{"rabbit": "frame_max"}
	long := mk("id_and_aggregate_longer_than_an_index_entry_and_too_large", "", lit(`{"blob":"`+big+`"}`), "'{}'")
	long.id, long.agg = longID, strings.Repeat("a", 5000)
	long.cols["id"], long.cols["aggregate_id"], long.cols["event_type"] = lit(longID), lit(long.agg), "'order.noted'"
	// RabbitMQ refuses the id first: an AMQP message_id is a short string.
	long.parked = map[string]string{"bus": "max_payload", "kafka": "max_message_bytes", "rabbit": "message_id", "streams": "proto-max-bulk-len"}
	// Usable, but deeper than the parked table keeps as JSON.
	fairlyDeep := mk("payload_nested_5000_deep", "h-1", lit(`{"d":`+strings.Repeat("[", 5000)+strings.Repeat("]", 5000)+`}`)+"::jsonb", "'{}'")
	fairlyDeep.starts = true
	// A trigger whose aggregate id (random, so it does not compress) is
	// longer than an index entry takes.
	var agg strings.Builder
	for agg.Len() < 6000 {
		agg.WriteString(uuid.NewString())
	}
	longAgg := mk("trigger_with_an_aggregate_id_longer_than_an_index_entry", agg.String(), `'{"n":1}'`, "'{}'")
	longAgg.starts = true
	// An id a header value cannot hold.
	lineBreak := mk("id_with_a_line_break", "h-1", `'{"n":1}'`, "'{}'")
	lineBreak.id = "line\nbreak " + lineBreak.id
	lineBreak.cols["id"] = lit(lineBreak.id)
	lineBreak.starts = true
	return []hostileCase{deepPayload, deepHeaders, deepObject, nullPayload, nullType, noID, tooBig, bigHeaders, frameHeaders, long, fairlyDeep, longAgg, lineBreak}
}

// TestHostileRowsGoThrough: rows PostgreSQL accepts and the relay cannot
// use as they are (JSON nested deeper than Go encodes, in payload or
// headers; NULL where a value is expected; payloads and headers larger
// than the brokers take, headers larger than an AMQP frame; ids and
// aggregate ids longer than an index entry) are written while a webhook, a
// NATS, a Kafka, a RabbitMQ and a Redis Streams sink and a declared saga
// run. None of them fails a batch; what a broker cannot take is parked
// with its reason and the rest goes on.
func TestHostileRowsGoThrough(t *testing.T) {
	// Not parallel: the sinks' secrets are passed through the environment.
	brokers := launchHostileBrokers(t)
	db := pgtest.NewDB(t)
	h := startHostileRelay(t, db, brokers)
	conn, err := pgx.Connect(context.Background(), db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	checkHostile(t, h, conn, hostileCases(), 1)
}

// TestTextThatIsNotUTF8GoesThrough: in a SQL_ASCII database a producer
// stores any bytes as text and in jsonb strings. Rows whose event type,
// aggregate id, payload or headers are not UTF-8 are dead letters, reach
// every sink as poison, and the stream goes on.
func TestTextThatIsNotUTF8GoesThrough(t *testing.T) {
	// Not parallel: the sinks' secrets are passed through the environment.
	brokers := launchHostileBrokers(t)
	ctx := context.Background()
	c := pgtest.Cluster(t)
	admin, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	name := fmt.Sprintf("ascii_%d_%d", os.Getpid(), time.Now().UnixNano()%1e6)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE template0 ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C'"); err != nil {
		t.Fatal(err)
	}
	db := &pgtest.DB{Name: name, URL: c.DSN(name), Slot: "slot_" + name, Publication: "pub_" + name, Cluster: c}
	pool, err := pgxpool.New(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	db.Pool = pool
	t.Cleanup(func() { pool.Close(); pgtest.Drop(c, name) })
	if _, err := migrations.Apply(ctx, pool, migrations.Options{}); err != nil {
		t.Fatal(err)
	}
	h := startHostileRelay(t, db, brokers)
	// The producer's session says its bytes are SQL_ASCII: PostgreSQL
	// then checks nothing.
	conn, err := pgx.Connect(ctx, db.URL+"&client_encoding=SQL_ASCII")
	if err != nil && strings.Contains(err.Error(), "?") {
		t.Fatal(err)
	}
	if err != nil {
		conn, err = pgx.Connect(ctx, db.URL+"?client_encoding=SQL_ASCII")
	}
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	mk := func(name, agg, typ, payload, headers string) hostileCase {
		id := uuid.NewString()
		return hostileCase{name: name, id: id, agg: agg, deadLetter: true, cols: map[string]string{"id": lit(id), "aggregate_type": "'order'",
			"aggregate_id": lit(agg), "event_type": typ, "payload": payload, "headers": headers}}
	}
	badType := mk("event_type_not_utf8", "h-1", `E'order.pla\xffced'`, `'{"n":1}'`, "'{}'")
	badType.poison = "is not valid UTF-8"
	badAgg := mk("aggregate_id_not_utf8", "h-\xff", "'order.placed'", `'{"n":1}'`, "'{}'")
	badAgg.cols["aggregate_id"] = `E'h-\xff'`
	badAgg.poison = "aggregate_id"
	badPayload := mk("payload_not_utf8", "h-1", "'order.placed'", `E'{"note":"caf\xe9"}'::jsonb`, "'{}'")
	badPayload.poison = "payload is not valid UTF-8"
	badHeaders := mk("headers_not_utf8", "h-1", "'order.placed'", `'{"n":1}'`, `E'{"k\xfe":"v\xfe"}'::jsonb`)
	badHeaders.poison = "headers is not valid UTF-8"
	checkHostile(t, h, conn, []hostileCase{badType, badAgg, badPayload, badHeaders}, 2)
}
