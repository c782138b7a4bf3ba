package cdc_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

// A Debezium-style outbox table with a text id and a text payload, mapped
// with --outbox-columns. Fields the table lacks are empty; a payload that is
// not JSON becomes a poison event and the stream goes on.
func TestDebeziumStyleOutboxTable(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	exec(t, db.Pool, `CREATE SCHEMA app; CREATE TABLE app.dbz_outbox (id text PRIMARY KEY, aggregatetype varchar(255) NOT NULL,
		aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload text)`)
	cols, err := outbox.ParseColumnMap("id=id,event_type=type,payload=payload,aggregate_type=aggregatetype,aggregate_id=aggregateid")
	if err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(t, db)
	cfg.Table = outbox.TableName{Schema: "app", Name: "dbz_outbox"}
	cfg.Columns = cols
	ctx := context.Background()
	if err := cdc.Preflight(ctx, db.Pool, cfg); err != nil {
		t.Fatalf("Preflight: %v", err)
	}
	sink := newSink(t, db.Pool)
	sink.keep = true
	startStream(t, cfg, sink)
	testkit.WaitFor(t, 20*time.Second, "first checkpoint", func() bool { return checkpointLSN(t, db.Pool, db.Slot) != 0 })
	exec(t, db.Pool, `INSERT INTO app.dbz_outbox VALUES
		('order-1', 'Order', '42', 'OrderCreated', '{"total": 10}'),
		('order-2', 'Order', '43', 'OrderCreated', 'not json {'),
		('6f9619ff-8b86-d011-b42d-00cf4fc964ff', 'Order', '44', 'OrderCreated', '[1,2]')`)
	testkit.WaitFor(t, 20*time.Second, "three events", func() bool { return len(sink.kept()) == 3 })
	evs := sink.kept()
	if e := evs[0]; e.RawID != "order-1" || e.ID != outbox.EventIDFromText("order-1") || e.EventType != "OrderCreated" ||
		e.AggregateType != "Order" || e.AggregateID != "42" || string(e.Payload) != `{"total": 10}` || e.Poison != "" ||
		e.TenantID != outbox.NilTenant || e.Headers != nil || e.CorrelationID.Valid || !e.CreatedAt.IsZero() || e.LSN == 0 ||
		e.PayloadJSONB {
		t.Fatalf("event 1: %+v", e)
	}
	if e := evs[1]; !strings.Contains(e.Poison, "payload is not valid JSON") || e.RawID != "order-2" || e.Raw["payload"] != "not json {" {
		t.Fatalf("event 2 should be poison with its raw row: %+v", e)
	}
	if e := evs[2]; e.ID != uuid.MustParse("6f9619ff-8b86-d011-b42d-00cf4fc964ff") || string(e.Payload) != "[1,2]" || e.Poison != "" {
		t.Fatalf("event 3: %+v", e)
	}
}

// A table with a bytea payload (JSON text inside), json headers, a domain
// over uuid and a text tenant id.
func TestByteaPayloadAndOtherColumnTypes(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	exec(t, db.Pool, `CREATE DOMAIN event_uuid AS uuid`)
	exec(t, db.Pool, `CREATE TABLE events_out (eid event_uuid PRIMARY KEY, tenant text, kind text NOT NULL,
		body bytea NOT NULL, meta json, corr uuid, at timestamp NOT NULL DEFAULT '2024-05-06 07:08:09.123456')`)
	cols, err := outbox.ParseColumnMap("id=eid,tenant_id=tenant,event_type=kind,payload=body,headers=meta,correlation_id=corr,created_at=at")
	if err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(t, db)
	cfg.Table = outbox.TableName{Name: "events_out"}
	cfg.Columns = cols
	sink := newSink(t, db.Pool)
	sink.keep = true
	startStream(t, cfg, sink)
	testkit.WaitFor(t, 20*time.Second, "first checkpoint", func() bool { return checkpointLSN(t, db.Pool, db.Slot) != 0 })
	tenant, corr, id1, id2 := uuid.New(), uuid.New(), uuid.New(), uuid.New()
	exec(t, db.Pool, `INSERT INTO events_out (eid, tenant, kind, body, meta, corr) VALUES
		($1, $2, 'k', convert_to('{"a": "é"}', 'UTF8'), '{"h": 1}', $3),
		($4, 'not-a-uuid', 'k', '\x00ff'::bytea, NULL, NULL)`, id1, tenant.String(), corr, id2)
	testkit.WaitFor(t, 20*time.Second, "two events", func() bool { return len(sink.kept()) == 2 })
	evs := sink.kept()
	want := time.Date(2024, 5, 6, 7, 8, 9, 123456000, time.UTC)
	if e := evs[0]; e.ID != id1 || e.TenantID != tenant || string(e.Payload) != `{"a": "é"}` || string(e.Headers) != `{"h": 1}` ||
		e.CorrelationID.UUID != corr || !e.CreatedAt.Equal(want) || e.Poison != "" || e.PayloadJSONB {
		t.Fatalf("event 1: %+v (payload %s)", e, e.Payload)
	}
	if e := evs[1]; e.ID != id2 || !strings.Contains(e.Poison, "tenant_id") || !strings.Contains(e.Poison, "payload (bytea) is not JSON") {
		t.Fatalf("event 2 should be poison for its tenant and payload: %+v", e)
	}
}

// A payload from a jsonb column is marked as such (writers need not check
// it again for jsonb); the default outbox table's payload is jsonb.
func TestJSONBPayloadIsMarked(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	sink := newSink(t, db.Pool)
	sink.keep = true
	startStream(t, baseConfig(t, db), sink)
	testkit.WaitFor(t, 20*time.Second, "first checkpoint", func() bool { return checkpointLSN(t, db.Pool, db.Slot) != 0 })
	id := uuid.New()
	exec(t, db.Pool, `INSERT INTO outbox (id, event_type, payload, created_at) VALUES ($1, 'k', '{"a": [1, 2.50, "\u00e9"]}', '2026-12-01 22:25:18.123456+00')`, id)
	testkit.WaitFor(t, 20*time.Second, "the event", func() bool { return len(sink.kept()) == 1 })
	e := sink.kept()[0]
	if e.ID != id || !e.PayloadJSONB || string(e.Payload) != `{"a": [1, 2.50, "é"]}` || e.Poison != "" ||
		!e.CreatedAt.Equal(time.Date(2026, 12, 1, 22, 25, 18, 123456000, time.UTC)) {
		t.Fatalf("event: %+v (payload %s)", e, e.Payload)
	}
	if err := outbox.CheckJSONB(e.Payload); err != nil {
		t.Fatalf("a jsonb value's text fails CheckJSONB: %v", err)
	}
}

// A mapped column that is missing or of the wrong type: one clear error,
// naming it, from Preflight and from Run alike.
func TestMissingOrMistypedColumnIsNamed(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	exec(t, db.Pool, `CREATE TABLE legacy_outbox (id uuid PRIMARY KEY, type text NOT NULL, payload integer)`)
	ctx := context.Background()
	for _, c := range []struct {
		columns string
		want    []string
	}{
		{"event_type=kind", []string{`"kind"`, "event_type", "legacy_outbox", "--outbox-columns"}},
		{"event_type=type", []string{`"payload"`, "integer", "jsonb"}},
		{"event_type=type,payload=type,aggregate_type=agg", []string{`"agg"`, "aggregate_type"}},
	} {
		cols, err := outbox.ParseColumnMap(c.columns)
		if err != nil {
			t.Fatal(err)
		}
		cfg := baseConfig(t, db)
		cfg.Table = outbox.TableName{Name: "legacy_outbox"}
		cfg.Columns = cols
		err = cdc.Preflight(ctx, db.Pool, cfg)
		if !errors.Is(err, cdc.ErrOutboxColumn) {
			t.Fatalf("%s: Preflight = %v, want ErrOutboxColumn", c.columns, err)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not mention %s", c.columns, err, w)
			}
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("error is not one line: %q", err)
		}
		runErr, done := startStream(t, cfg, newSink(t, db.Pool)).wait(20 * time.Second)
		if !done || !errors.Is(runErr, cdc.ErrOutboxColumn) {
			t.Fatalf("%s: Run = %v (returned %t), want ErrOutboxColumn", c.columns, runErr, done)
		}
	}
	cfg := baseConfig(t, db)
	cfg.Table = outbox.TableName{Name: "no_such_table"}
	if err := cdc.Preflight(ctx, db.Pool, cfg); !errors.Is(err, cdc.ErrOutboxTable) || !strings.Contains(err.Error(), "no_such_table") {
		t.Fatalf("Preflight of a missing table = %v", err)
	}
}

// Identifiers that would break naive SQL are quoted everywhere (table,
// schema, columns, publication); a slot name PostgreSQL cannot hold is
// refused before any SQL runs.
func TestHostileIdentifiersAreQuotedOrRefused(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	schema, table := `My "Schema"`, `out.box'; DROP TABLE outbox; --`
	evCol, payCol := `Event "Type"`, `pay'load`
	q := func(s ...string) string { return pgx.Identifier(s).Sanitize() }
	exec(t, db.Pool, `CREATE SCHEMA `+q(schema))
	exec(t, db.Pool, `CREATE TABLE `+q(schema, table)+` (id uuid PRIMARY KEY, `+q(evCol)+` text NOT NULL, `+q(payCol)+` jsonb NOT NULL)`)
	tn, err := outbox.ParseTableName(q(schema, table))
	if err != nil || tn.Schema != schema || tn.Name != table {
		t.Fatalf("ParseTableName: %+v %v", tn, err)
	}
	cols, err := outbox.ParseColumnMap("event_type=" + q(evCol) + ",payload=" + q(payCol))
	if err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(t, db)
	cfg.Table = tn
	cfg.Columns = cols
	cfg.Publication = `pub'"; DROP PUBLICATION x; --`
	sink := newSink(t, db.Pool)
	sink.keep = true
	startStream(t, cfg, sink)
	testkit.WaitFor(t, 20*time.Second, "first checkpoint", func() bool { return checkpointLSN(t, db.Pool, db.Slot) != 0 })
	id := uuid.New()
	exec(t, db.Pool, `INSERT INTO `+q(schema, table)+` VALUES ($1, 'hostile.ok', '{"ok": true}')`, id)
	testkit.WaitFor(t, 20*time.Second, "the event", func() bool { return len(sink.kept()) == 1 })
	if e := sink.kept()[0]; e.ID != id || e.EventType != "hostile.ok" || string(e.Payload) != `{"ok": true}` {
		t.Fatalf("event %+v", e)
	}
	var tables int
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_publication_tables WHERE pubname = $1`, cfg.Publication).Scan(&tables); err != nil || tables != 1 {
		t.Fatalf("publication %q covers %d tables (err %v), want exactly the outbox", cfg.Publication, tables, err)
	}
	exec(t, db.Pool, `SELECT 1 FROM outbox LIMIT 1`) // still there

	for _, slot := range []string{`s"; DROP`, "UPPER", "has space", strings.Repeat("a", 64), ""} {
		bad := cfg
		bad.Slot = slot
		if slot == "" {
			bad.Slot = "a-b"
		}
		if _, err := cdc.NewStream(bad, sink); !errors.Is(err, cdc.ErrConfig) || !strings.Contains(err.Error(), "Config.Slot") {
			t.Errorf("slot %q: NewStream = %v, want ErrConfig naming Config.Slot", slot, err)
		}
	}
}

// A 10 MB payload arrives whole.
func TestLargePayloadArrivesWhole(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	sink := newSink(t, db.Pool)
	sink.keep = true
	startStream(t, baseConfig(t, db), sink)
	testkit.WaitFor(t, 20*time.Second, "first checkpoint", func() bool { return checkpointLSN(t, db.Pool, db.Slot) != 0 })
	blob := strings.Repeat("0123456789abcdef", 10<<20/16)
	payload, _ := json.Marshal(map[string]string{"blob": blob})
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		return outbox.Write(ctx, tx, outbox.Message{EventType: "big", Payload: json.RawMessage(payload)})
	})
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 30*time.Second, "the big event", func() bool { return len(sink.kept()) == 1 })
	var got map[string]string
	if err := json.Unmarshal(sink.kept()[0].Payload, &got); err != nil || got["blob"] != blob {
		t.Fatalf("payload of %d bytes came back as %d bytes (err %v)", len(payload), len(sink.kept()[0].Payload), err)
	}
}

// A partitioned outbox table: the publication publishes through its root,
// so inserts into any partition arrive as the outbox's. A publication made
// without that is refused, since its inserts would be skipped.
func TestPartitionedOutboxTable(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	exec(t, db.Pool, `CREATE TABLE part_outbox (id uuid NOT NULL, event_type text NOT NULL, payload jsonb NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now()) PARTITION BY RANGE (created_at)`)
	exec(t, db.Pool, `CREATE TABLE part_outbox_old PARTITION OF part_outbox FOR VALUES FROM (MINVALUE) TO ('2025-01-01')`)
	exec(t, db.Pool, `CREATE TABLE part_outbox_new PARTITION OF part_outbox FOR VALUES FROM ('2025-01-01') TO (MAXVALUE)`)
	cfg := baseConfig(t, db)
	cfg.Table = outbox.TableName{Name: "part_outbox"}
	ctx := context.Background()

	exec(t, db.Pool, `CREATE PUBLICATION leafy FOR TABLE part_outbox WITH (publish = 'insert')`)
	leafy := cfg
	leafy.Publication = "leafy"
	if err := cdc.Preflight(ctx, db.Pool, leafy); !errors.Is(err, cdc.ErrPublication) || !strings.Contains(err.Error(), "publish_via_partition_root") {
		t.Fatalf("Preflight with a leaf-publishing publication = %v, want ErrPublication", err)
	}

	sink := newSink(t, db.Pool)
	sink.keep = true
	startStream(t, cfg, sink)
	testkit.WaitFor(t, 20*time.Second, "first checkpoint", func() bool { return checkpointLSN(t, db.Pool, db.Slot) != 0 })
	exec(t, db.Pool, `INSERT INTO part_outbox (id, event_type, payload, created_at) VALUES
		(gen_random_uuid(), 'old', '{}', '2020-01-01'), (gen_random_uuid(), 'new', '{}', now())`)
	testkit.WaitFor(t, 20*time.Second, "events from both partitions", func() bool { return len(sink.kept()) == 2 })
}
