package cdc

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

func TestHealthReport(t *testing.T) {
	t.Parallel()
	const stall = 10 * time.Second
	t0 := time.Unix(1000, 0)
	var h health
	if r := h.report(stall, t0); r.Stalled || len(r.Reasons) > 0 {
		t.Fatalf("fresh stream: %+v", r)
	}

	// Work handed over and committed in time: healthy.
	b1 := Batch{EndLSN: pglogrepl.LSN(100)}
	h.handOver(b1, t0)
	if r := h.report(stall, t0.Add(stall)); r.Stalled {
		t.Errorf("work waiting exactly StallAfter is not stalled yet: %+v", r)
	}
	h.committed(b1, t0.Add(time.Second))
	if r := h.report(stall, t0.Add(time.Hour)); r.Stalled {
		t.Errorf("an idle stream long after its last commit is stalled: %+v", r)
	}

	// A batch that fails: stalled after StallAfter with its error, or at
	// once after BatchFailureThreshold failures.
	t1 := t0.Add(2 * time.Hour)
	b2 := Batch{EndLSN: pglogrepl.LSN(0x1A4A210)}
	h.handOver(b2, t1)
	h.failed(b2, "permission denied for table relay_checkpoints")
	r := h.report(stall, t1.Add(stall+time.Second))
	if !r.Stalled || len(r.Reasons) != 1 || r.Reasons[0] != "stream: the batch at 0/1A4A210 failed 1 times: permission denied for table relay_checkpoints" {
		t.Errorf("a batch failing for longer than StallAfter: %+v", r)
	}
	for range BatchFailureThreshold - 1 {
		h.sessionEnded("the sink failed", t1)
		h.streaming()
		h.handOver(b2, t1)
		h.failed(b2, "permission denied for table relay_checkpoints")
	}
	if r := h.report(stall, t1.Add(time.Second)); !r.Stalled || !strings.Contains(r.Reasons[0], "failed 5 times") || r.BatchFailures != 5 {
		t.Errorf("5 failures of one batch within StallAfter: %+v", r)
	}
	// It goes through: healthy again, the failures still counted.
	h.committed(b2, t1.Add(2*time.Second))
	if r := h.report(stall, t1.Add(time.Minute)); r.Stalled || r.BatchFailures != 5 {
		t.Errorf("after the batch went through: %+v", r)
	}

	// Down (the database unreachable) for longer than StallAfter.
	t2 := t1.Add(time.Hour)
	h.sessionEnded("cdc: connect: connection refused", t2)
	h.sessionEnded("cdc: connect: connection refused", t2.Add(5*time.Second))
	if r := h.report(stall, t2.Add(5*time.Second)); r.Stalled {
		t.Errorf("down for less than StallAfter: %+v", r)
	}
	r = h.report(stall, t2.Add(stall+time.Second))
	if !r.Stalled || len(r.Reasons) != 1 || r.Reasons[0] != "stream: not streaming for 11s: cdc: connect: connection refused" {
		t.Errorf("down for longer than StallAfter: %+v", r)
	}
	h.streaming()
	if r := h.report(stall, t2.Add(time.Minute)); r.Stalled {
		t.Errorf("streaming again: %+v", r)
	}

	// Standing by for the slot (another replica leads): ready, whatever
	// this process handed over before.
	h.handOver(Batch{EndLSN: pglogrepl.LSN(0x2000000)}, t2)
	h.sessionEnded("lost the leadership lock", t2)
	h.standingBy()
	if r := h.report(stall, t2.Add(time.Hour)); r.Stalled {
		t.Errorf("standing by: %+v", r)
	}
}
