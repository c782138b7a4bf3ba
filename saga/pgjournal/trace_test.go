package pgjournal_test

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
)

// TestTraceParentKept: the traceparent an instance is enqueued with is what
// a claim and Get return, so that its steps continue that trace; none stays
// empty.
func TestTraceParentKept(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	traced := saga.Instance{ID: uuid.New(), TenantID: uuid.New(), SagaName: "pg", SagaVersion: 1, TriggerEventID: uuid.New(), TraceParent: tp}
	plain := saga.Instance{ID: uuid.New(), TenantID: uuid.New(), SagaName: "pg", SagaVersion: 1, TriggerEventID: uuid.New()}
	for _, in := range []saga.Instance{traced, plain} {
		if err := b.j.Enqueue(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	got, err := b.j.ClaimPending(ctx, 10, time.Minute)
	if err != nil || len(got) != 2 {
		t.Fatalf("claimed %d, %v", len(got), err)
	}
	for _, c := range got {
		want := ""
		if c.ID == traced.ID {
			want = tp
		}
		if c.TraceParent != want {
			t.Errorf("claimed %s with traceparent %q; want %q", c.ID, c.TraceParent, want)
		}
	}
	one, err := b.j.Get(ctx, traced.ID)
	if err != nil || one.TraceParent != tp {
		t.Fatalf("Get: traceparent %q, %v", one.TraceParent, err)
	}
}
