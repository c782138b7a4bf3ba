package httpapi

import (
	"strings"
	"testing"
	"time"

	"github.com/compensa/compensa/saga/admin"
)

// TestChartAxes: both charts carry y ticks labelled in their unit, from 0
// up past the largest value, and x ticks of UTC times inside the plot.
func TestChartAxes(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	var samples []LagSample
	for i := range 61 {
		samples = append(samples, LagSample{At: t0.Add(time.Duration(i) * 5 * time.Second), OK: true,
			LagSeconds: float64(i) / 10, LagBytes: int64(i) * 40_000})
	}
	c := newChart(samples)
	labels := func(ts []tick) []string {
		var out []string
		for _, x := range ts {
			out = append(out, x.Label)
		}
		return out
	}
	if got := labels(c.SecondsTicks); len(got) < 3 || got[0] != "0 s" || got[len(got)-1] != "6 s" {
		t.Errorf("seconds ticks %v, want 0 s … 6 s", got)
	}
	if got := labels(c.BytesTicks); c.BytesUnit != "MiB" || got[0] != "0 MiB" || !strings.HasSuffix(got[len(got)-1], " MiB") {
		t.Errorf("bytes ticks %v in %s, want MiB", got, c.BytesUnit)
	}
	if got := labels(c.XTicks); len(got) < 3 || got[0] != "10:00:00" || got[len(got)-1] != "10:05:00" {
		t.Errorf("time ticks %v, want 10:00:00 … 10:05:00", got)
	}
	for _, x := range c.XTicks {
		if x.At < c.Left || x.At > c.Right {
			t.Errorf("time tick %v outside the plot [%v, %v]", x, c.Left, c.Right)
		}
	}
	top := c.SecondsTicks[len(c.SecondsTicks)-1]
	if top.At != c.Top || c.SecondsTicks[0].At != c.Base {
		t.Errorf("seconds axis from %v to %v, want the plot's %v to %v", c.SecondsTicks[0].At, top.At, c.Base, c.Top)
	}

	var ms []admin.MinuteCounts
	for i := range 60 {
		ms = append(ms, admin.MinuteCounts{Minute: t0.Add(time.Duration(i) * time.Minute), Started: int64(i % 7)})
	}
	o := newOverviewChart(ms)
	if got := labels(o.YTicks); got[0] != "0" || got[len(got)-1] != "6" {
		t.Errorf("per-minute ticks %v, want 0 … 6 instances", got)
	}
	if got := labels(o.XTicks); len(got) < 3 || got[0] != "10:00" {
		t.Errorf("per-minute time ticks %v", got)
	}
	if one := newOverviewChart(ms[:1]); len(one.YTicks) < 2 {
		t.Errorf("a chart of one empty minute has ticks %v", one.YTicks)
	}
}
