package sinks

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/correlator"
	"github.com/compensa/compensa/migrations"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/sink/kafkasink"
	"github.com/compensa/compensa/sink/natssink"
	"github.com/compensa/compensa/sink/webhook"
	"github.com/compensa/compensa/test/natstest"
	"github.com/compensa/compensa/test/pgtest"
)

// newSQLASCIIDB creates a migrated database whose encoding is SQL_ASCII:
// there text and jsonb hold any bytes a producer sends, UTF-8 or not.
func newSQLASCIIDB(t testing.TB) *pgtest.DB {
	t.Helper()
	ctx := context.Background()
	c := pgtest.Cluster(t)
	admin, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	name := "ascii_" + strings.ReplaceAll(uuid.NewString()[:18], "-", "")
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
	return db
}

// asciiConn connects to db as a producer whose bytes PostgreSQL takes as
// they are (client_encoding SQL_ASCII).
func asciiConn(t testing.TB, db *pgtest.DB) *pgx.Conn {
	t.Helper()
	sep := "?"
	if strings.Contains(db.URL, "?") {
		sep = "&"
	}
	conn, err := pgx.Connect(context.Background(), db.URL+sep+"client_encoding=SQL_ASCII")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// fuzzTables are producer outbox tables with the column types the relay
// reads payload and headers from.
var fuzzTables = []struct{ name, payload, headers string }{
	{"fz_jsonb", "jsonb", "jsonb"},
	{"fz_text", "text", "text"},
	{"fz_bytea", "bytea", "json"},
}

// FuzzHostileRow writes generated rows (nesting depth, sizes, bytes that
// are not UTF-8, NULLs, each column type the relay reads) into outbox
// tables of a SQL_ASCII database, where PostgreSQL checks the least, and
// puts every row PostgreSQL accepted through the relay's path: decoding
// (cdc.ReadEvent, the stream's decoder), the fan-out with a webhook, a NATS
// and a Kafka sink (each encoding it for real, with broker limits of 64 kB),
// and the correlator's batch transaction with a saga it may start. It
// asserts that no row can fail a batch, and that in every sink the event
// is delivered or parked (never neither), that a poison row is a dead
// letter, and that every webhook body is UTF-8 JSON.
func FuzzHostileRow(f *testing.F) {
	f.Add(uint8(0), "id-1", "order.placed", "order", "o-1", []byte(`{"n":1}`), []byte(`{"trace":"t"}`), uint16(0), uint32(0), uint8(0))
	f.Add(uint8(0), "id-2", "order.placed", "order", "o-1", []byte(`1`), []byte(`{}`), uint16(12000), uint32(0), uint8(0))
	f.Add(uint8(0), "id-3", "order.placed", "order", "o-1", []byte(`{}`), []byte(`[]`), uint16(12000), uint32(0), uint8(0x80))
	f.Add(uint8(1), "id-4", "order.placed", "order", "o-2", []byte("{\"a\":\"\xff\"}"), []byte("oops"), uint16(0), uint32(0), uint8(0))
	f.Add(uint8(2), "id-5", "order.pla\xffced", "ord\xfeer", "o-\xff", []byte("\x00\xff protobuf"), []byte(`{"k":"v"}`), uint16(0), uint32(0), uint8(0))
	f.Add(uint8(0), "id-6", "order.placed", "order", "o-3", []byte(`{"n":1}`), []byte(`{}`), uint16(0), uint32(300_000), uint8(0))
	f.Add(uint8(0), "", "order.placed", "order", "o-4", []byte(`{}`), []byte(`{}`), uint16(0), uint32(0), uint8(0b0111_1110))
	f.Add(uint8(1), strings.Repeat("i", 3000), "x", "order", strings.Repeat("a", 3000), []byte(`{"n":1e200000}`), []byte(`{}`), uint16(5000), uint32(0), uint8(0))

	ctx := context.Background()
	db := newSQLASCIIDB(f)
	producer := asciiConn(f, db)
	for _, tb := range fuzzTables {
		if _, err := db.Pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (id text, tenant_id text, aggregate_type text, aggregate_id text,
			event_type text, payload %s, headers %s, correlation_id text, created_at timestamptz DEFAULT now())`, tb.name, tb.payload, tb.headers)); err != nil {
			f.Fatal(err)
		}
	}
	var badBodies atomic.Int32
	var lastBad atomic.Value
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !utf8.Valid(body) || !json.Valid(body) {
			badBodies.Add(1)
			lastBad.Store(string(body[:min(len(body), 300)]))
		}
		w.WriteHeader(204)
	}))
	f.Cleanup(hook.Close)
	ns := natstest.Start(f, func(o *server.Options) { o.MaxPayload = 64 << 10 })
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(kc.Close)
	wh, err := webhook.New(webhook.Config{URL: hook.URL, Timeout: 5 * time.Second})
	if err != nil {
		f.Fatal(err)
	}
	bus, err := natssink.New(natssink.Config{URL: ns.URL(), Stream: "OUTBOX", Subject: sink.MustTemplate("outbox.{aggregate_type}.{event_type}"), Timeout: 5 * time.Second})
	if err != nil {
		f.Fatal(err)
	}
	kf, err := kafkasink.New(kafkasink.Config{Brokers: kc.ListenAddrs(), Topic: sink.MustTemplate("outbox.{aggregate_type}"), Timeout: 5 * time.Second, MaxMessageBytes: 64 << 10})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { wh.Close(); bus.Close(); kf.Close() })
	fan, err := sink.NewFanout(ctx, sink.FanoutConfig{Pool: db.Pool, Destinations: []sink.Destination{
		{Spec: sink.Spec{Name: "hook", Webhook: &sink.WebhookSpec{URL: hook.URL}}, Sink: wh},
		{Spec: sink.Spec{Name: "bus", NATS: &sink.NATSSpec{URL: ns.URL(), Stream: "OUTBOX"}}, Sink: bus},
		{Spec: sink.Spec{Name: "kafka", Kafka: &sink.KafkaSpec{Brokers: kc.ListenAddrs()}}, Sink: kf},
	}})
	if err != nil {
		f.Fatal(err)
	}
	corr, err := correlator.New(db.Pool, &correlator.Config{Registry: checkoutRegistry(), DisableNotify: true, InBatchTx: fan.WriteParked})
	if err != nil {
		f.Fatal(err)
	}
	handle := fan.Sink(corr)
	var end atomic.Uint64
	end.Store(1 << 32)

	f.Fuzz(func(t *testing.T, table uint8, id, eventType, aggType, aggID string, payload, headers []byte, depth uint16, pad uint32, nulls uint8) {
		tb := fuzzTables[int(table)%len(fuzzTables)]
		// The row is found again by its id, which the relay's (UTF-8)
		// session must be able to send.
		if !utf8.ValidString(id) || strings.ContainsRune(id, 0) {
			id = uuid.NewString()
		}
		// Each run's row is a new event: an id seen before would be
		// deduplicated by the dead letters and the parked table.
		lsn := end.Add(100)
		id += fmt.Sprintf("#%d", lsn)
		d := int(depth) % 13000
		wrap := func(b []byte) []byte {
			return append(append([]byte(strings.Repeat("[", d)), b...), strings.Repeat("]", d)...)
		}
		if nulls&0x80 == 0 {
			payload = wrap(payload)
		} else {
			headers = wrap(headers)
		}
		if p := int(pad) % (1 << 20); p > 0 {
			payload = append(append([]byte(`{"pad":"`+strings.Repeat("x", p)+`","v":`), payload...), '}')
		}
		vals := []any{id, nil, aggType, aggID, eventType, string(payload), string(headers)}
		if tb.payload == "bytea" {
			vals[5] = payload
		}
		for i := 1; i < len(vals); i++ { // bit i: column i is NULL (the id never is)
			if nulls&(1<<i) != 0 {
				vals[i] = nil
			}
		}
		if _, err := producer.Exec(ctx, "DELETE FROM "+tb.name); err != nil {
			t.Fatal(err)
		}
		if _, err := producer.Exec(ctx, "INSERT INTO "+tb.name+` (id, tenant_id, aggregate_type, aggregate_id, event_type, payload, headers)
			VALUES ($1, $2, $3, $4, $5, $6, $7)`, vals...); err != nil {
			t.Skipf("PostgreSQL refuses the row: %v", err) // not a row the relay can be given
		}
		ev, ok, err := cdc.ReadEvent(ctx, db.Pool, outbox.TableName{Schema: "public", Name: tb.name}, outbox.DefaultColumns(), id)
		if err != nil || !ok {
			t.Fatalf("read the row back: %v (found %v)", err, ok)
		}
		ev.LSN = lsn - 1
		before, err := sink.List(ctx, db.Pool)
		if err != nil {
			t.Fatal(err)
		}
		deadBefore := count(t, db, `SELECT count(*) FROM relay_dead_letters`)
		b := cdc.Batch{Slot: "fuzz", Events: []outbox.Event{ev}, CommitLSN: pglogrepl.LSN(lsn - 1), EndLSN: pglogrepl.LSN(lsn)}
		if err := handle.HandleBatch(ctx, b); err != nil {
			t.Fatalf("a row failed the batch: %v\npoison: %q", err, ev.Poison)
		}
		after, err := sink.List(ctx, db.Pool)
		if err != nil {
			t.Fatal(err)
		}
		for i, s := range after {
			if got := (s.Delivered - before[i].Delivered) + (s.Parked - before[i].Parked); got != 1 {
				t.Fatalf("sink %s: delivered %d and parked %d of the one event (poison %q)", s.Name,
					s.Delivered-before[i].Delivered, s.Parked-before[i].Parked, ev.Poison)
			}
		}
		if ev.Poison != "" && count(t, db, `SELECT count(*) FROM relay_dead_letters`) != deadBefore+1 {
			t.Fatalf("the poison row is no dead letter: %q", ev.Poison)
		}
		if n := badBodies.Load(); n > 0 {
			t.Fatalf("%d webhook bodies are not UTF-8 JSON, the last: %s", n, lastBad.Load())
		}
	})
}
