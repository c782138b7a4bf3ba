package sinks

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/test/cetest"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

// ceRecord is one Kafka record as a consumer sees it: the event the SDK
// decoded, the record's key and partition, and its "id" header.
type ceRecord struct {
	ev        *event.Event
	key, id   string
	partition int32
}

// ceKafkaReader consumes every partition of the topics it names from the
// start and decodes each record with the SDK, in the CloudEvents Kafka
// binding's terms (ce_ headers and content-type in binary mode, an
// application/cloudevents+json value in structured mode). A record the SDK
// cannot decode is kept in bad. One client for the whole test: its offsets
// move on, so every read returns only what is new.
type ceKafkaReader struct {
	cl  *kgo.Client
	mu  sync.Mutex
	got map[string][]ceRecord // topic → records in partition order
	bad []string
}

func newCEKafkaReader(t *testing.T, brokers []string, topics ...string) *ceKafkaReader {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.MetadataMinAge(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &ceKafkaReader{cl: cl, got: map[string][]ceRecord{}}
}

// read polls until a poll brings nothing and returns, per topic, every
// record read so far; a record the SDK could not decode fails t at once.
func (r *ceKafkaReader) read(t *testing.T) map[string][]ceRecord {
	t.Helper()
	got := r.poll()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.bad) > 0 {
		t.Fatalf("records the SDK could not decode: %v", r.bad)
	}
	return got
}

func (r *ceKafkaReader) poll() map[string][]ceRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		fs := r.cl.PollFetches(ctx)
		cancel()
		n := 0
		fs.EachRecord(func(rec *kgo.Record) {
			n++
			hs := map[string]string{}
			for _, h := range rec.Headers {
				if _, dup := hs[h.Key]; dup {
					r.bad = append(r.bad, fmt.Sprintf("%s: header %q twice", rec.Topic, h.Key))
				}
				hs[h.Key] = string(h.Value)
			}
			ev, err := cetest.Kafka(hs, rec.Value)
			if err != nil {
				r.bad = append(r.bad, fmt.Sprintf("%s offset %d: SDK: %v (%v)", rec.Topic, rec.Offset, err, hs))
				return
			}
			r.got[rec.Topic] = append(r.got[rec.Topic], ceRecord{ev: ev, key: string(rec.Key), id: hs["id"], partition: rec.Partition})
		})
		if n == 0 {
			out := map[string][]ceRecord{}
			for k, v := range r.got {
				out[k] = append([]ceRecord(nil), v...)
			}
			return out
		}
	}
}

// TestKafkaCloudEventsThroughTheRelaySurviveAKill: Kafka (kfake) in each
// CloudEvents mode through the real relay binary, every record decoded with
// the SDK and each attribute and extension checked against its row, as for
// the webhook and NATS. The relay is killed with -9 once the first events
// are in Kafka and more are committed while it is down: after the restart
// every event is there, under its outbox id (ce_id or the document's id =
// the header id), keyed by its aggregate, first occurrences in commit order
// per aggregate (a replay may add a record again: delivery is at least
// once, and the id is what a consumer deduplicates by).
func TestKafkaCloudEventsThroughTheRelaySurviveAKill(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(3))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	brokers := kc.ListenAddrs()
	file := filepath.Join(t.TempDir(), "sinks.yaml")
	os.WriteFile(file, []byte(fmt.Sprintf(`sinks:
  - name: ce-kafka-binary
    format: cloudevents
    source: /shop/orders
    kafka: { brokers: ["%[1]s"], topic: "ce.binary.{aggregate_type}", timeout: 5s }
  - name: ce-kafka-structured
    format: cloudevents-structured
    kafka: { brokers: ["%[1]s"], topic: "ce.structured.{aggregate_type}", timeout: 5s }
`, brokers[0])), 0o600)
	args := []string{"--database-url", db.URL, "--slot", db.Slot, "--publication", db.Publication, "--status-interval", "200ms",
		"--workers", "1", "--sinks", file}
	p := relaytest.Start(t, nil, args...)

	u, _ := url.Parse(db.URL)
	defaultSource := "/compensa/" + strings.TrimPrefix(u.Path, "/") + "/public.outbox"
	const perTx = 4
	want := map[string]ceWant{}
	var order []string // ids in commit order
	ctx := context.Background()
	commit := func(from int) {
		t.Helper()
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			var msgs []outbox.Message
			for i := from; i < from+perTx; i++ {
				m := outbox.Message{ID: uuid.New(), TenantID: uuid.New(), AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", i%2),
					EventType: "order.placed", Payload: map[string]int{"n": i}, CorrelationID: uuid.New(), CausationID: uuid.New(),
					Headers: map[string]string{"traceparent": "00-" + ceTraceID + "-b7ad6b7169203331-01", "tracestate": "vendor=7"}}
				msgs = append(msgs, m)
				want[m.ID.String()] = ceWant{m.ID.String(), m.AggregateID, m.EventType, m.TenantID, m.CorrelationID, m.CausationID, i}
				order = append(order, m.ID.String())
			}
			return outbox.Write(ctx, tx, msgs...)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	topics := map[string]string{"ce-kafka-binary": "ce.binary.order", "ce-kafka-structured": "ce.structured.order"}
	r := newCEKafkaReader(t, brokers, topics["ce-kafka-binary"], topics["ce-kafka-structured"])
	// firstIDs counts the distinct ids in each topic.
	firstIDs := func(got map[string][]ceRecord, topic string) int {
		seen := map[string]bool{}
		for _, rec := range got[topic] {
			seen[rec.ev.ID()] = true
		}
		return len(seen)
	}
	commit(0)
	testkit.WaitFor(t, 60*time.Second, "the first transaction's events in both topics", func() bool {
		got := r.read(t)
		return firstIDs(got, topics["ce-kafka-binary"]) == perTx && firstIDs(got, topics["ce-kafka-structured"]) == perTx
	})
	p.Kill()
	commit(perTx) // while the relay is down
	p = relaytest.Start(t, nil, args...)
	var got map[string][]ceRecord
	testkit.WaitFor(t, 60*time.Second, "every event in both topics after the restart", func() bool {
		got = r.read(t)
		return firstIDs(got, topics["ce-kafka-binary"]) == 2*perTx && firstIDs(got, topics["ce-kafka-structured"]) == 2*perTx
	})
	p.Stop(30 * time.Second)

	for name, topic := range topics {
		source := "/shop/orders"
		if name == "ce-kafka-structured" {
			source = defaultSource
		}
		recs := got[topic]
		first := map[string]ceRecord{}
		pos := map[string]int{}
		partitionOf := map[string]int32{} // aggregate → its partition
		for i, rec := range recs {
			id := rec.ev.ID()
			if rec.id != id {
				t.Errorf("%s: record with ce id %s has the header id %q", name, id, rec.id)
			}
			if rec.key != rec.ev.Subject() {
				t.Errorf("%s: %s: key %q, subject %q: the key is the aggregate id", name, id, rec.key, rec.ev.Subject())
			}
			if p, ok := partitionOf[rec.key]; ok && p != rec.partition {
				t.Errorf("%s: aggregate %s in partitions %d and %d", name, rec.key, p, rec.partition)
			}
			partitionOf[rec.key] = rec.partition
			if _, ok := first[id]; !ok {
				first[id], pos[id] = rec, i
			}
		}
		for id, w := range want {
			if rec, ok := first[id]; !ok {
				t.Errorf("%s: %s not in %s", name, id, topic)
			} else {
				checkCE(t, name, rec.ev, w, source)
			}
		}
		// recs is in partition order within each partition, and one
		// aggregate is in one partition: first occurrences follow commit
		// order per aggregate.
		last := map[string]int{}
		for _, id := range order {
			agg := want[id].aggregate
			if prev, ok := last[agg]; ok && pos[id] < prev {
				t.Errorf("%s: aggregate %s: %s first appears before an event committed earlier", name, agg, id)
			}
			last[agg] = pos[id]
		}
		t.Logf("%s: %d records for %d events", name, len(recs), len(want))
	}
}
