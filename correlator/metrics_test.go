package correlator_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The correlator's own collectors report its Stats: a trigger and an event
// no saga listens to show as one start and one ignored event.
func TestCollectorsReportTheCorrelatorsStats(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	other := trigger(uuid.New())
	other.EventType = "nobody.listens"
	if err := b.corr.HandleBatch(ctx, b.batch(trigger(uuid.New()), other)); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	for _, c := range b.corr.Collectors() {
		reg.MustRegister(c)
	}
	for name, want := range map[string]float64{
		"compensa_events_streamed_total": 2, "compensa_batches_total": 1,
		"compensa_correlator_sagas_started_total": 1, "compensa_events_parked_total": 0,
	} {
		got, err := testutil.GatherAndCount(reg, name)
		if err != nil || got != 1 {
			t.Fatalf("%s: %d series (%v), want 1", name, got, err)
		}
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() == name {
				if v := mf.Metric[0].GetCounter().GetValue(); v != want {
					t.Errorf("%s = %v, want %v", name, v, want)
				}
			}
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	outcomes := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "compensa_events_total" {
			continue
		}
		for _, m := range mf.Metric {
			outcomes[m.Label[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	if outcomes["started"] != 1 || outcomes["ignored"] != 1 || len(outcomes) != 5 {
		t.Fatalf("compensa_events_total by outcome = %v, want started 1, ignored 1 and five outcomes", outcomes)
	}
}
