package webhook_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/sink/webhook"
)

// BenchmarkDeliver posts batches of single-event aggregates to a local
// endpoint answering 204, at the default concurrency, and reports the
// process's CPU time per event (client and endpoint together), which a
// busy machine changes less than the wall time.
func BenchmarkDeliver(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	defer srv.Close()
	s, err := webhook.New(webhook.Config{URL: srv.URL, Secret: secret, Concurrency: 16})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	const batch = 1000
	evs := make([]*sink.Event, batch)
	for i := range evs {
		evs[i] = &sink.Event{ID: uuid.NewString(), TenantID: uuid.NewString(), AggregateType: "order", AggregateID: fmt.Sprint(i),
			EventType: "bench.event", CreatedAt: time.Now(),
			Payload: json.RawMessage(fmt.Sprintf(`{"seq": %d, "currency": "EUR", "order_id": "%s", "amount_cents": 4200}`, i, uuid.NewString()))}
	}
	cpu := func() time.Duration {
		var ru syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	b.ResetTimer()
	began := cpu()
	for b.Loop() {
		for _, err := range s.Deliver(b.Context(), evs) {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(cpu()-began)/float64(b.N*batch), "cpu-ns/event")
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "events/s")
}
