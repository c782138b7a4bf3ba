package httpapi

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/compensa/compensa/saga/admin"
)

// The page's charts, drawn as inline SVG: the last hour of outcomes and
// the replication lag.

// overviewChart draws the last hour per minute: started, completed,
// compensated and failed, one polyline each.
type overviewChart struct {
	Width, Height                                               int
	Started, Completed, Compensated, Failed                     string
	Max                                                         int64
	From, To                                                    string
	TotalStarted, TotalCompleted, TotalCompensated, TotalFailed int64
}

func newOverviewChart(ms []admin.MinuteCounts) overviewChart {
	c := overviewChart{Width: 600, Height: 120}
	if len(ms) == 0 {
		return c
	}
	c.From, c.To = ms[0].Minute.UTC().Format("15:04"), ms[len(ms)-1].Minute.UTC().Format("15:04")
	for _, m := range ms {
		c.Max = max(c.Max, m.Started, m.Completed, m.Compensated, m.Failed)
		c.TotalStarted += m.Started
		c.TotalCompleted += m.Completed
		c.TotalCompensated += m.Compensated
		c.TotalFailed += m.Failed
	}
	line := func(v func(admin.MinuteCounts) int64) string {
		var b strings.Builder
		for i, m := range ms {
			x := float64(i) / float64(max(len(ms)-1, 1)) * float64(c.Width)
			y := float64(c.Height)
			if c.Max > 0 {
				y = float64(c.Height) - float64(v(m))/float64(c.Max)*float64(c.Height-4)
			}
			fmt.Fprintf(&b, "%.1f,%.1f ", x, y)
		}
		return strings.TrimSpace(b.String())
	}
	c.Started = line(func(m admin.MinuteCounts) int64 { return m.Started })
	c.Completed = line(func(m admin.MinuteCounts) int64 { return m.Completed })
	c.Compensated = line(func(m admin.MinuteCounts) int64 { return m.Compensated })
	c.Failed = line(func(m admin.MinuteCounts) int64 { return m.Failed })
	return c
}

// chart is the lag chart, drawn as an inline SVG from the kept samples.
type chart struct {
	Width, Height   int
	SecondsPoints   string
	BytesPoints     string
	MaxSeconds      float64
	MaxBytes        int64
	From, To        string
	Samples         int
	Gaps            []float64 // x positions of failed samples
	LatestOK        bool
	HasSamples      bool
	LastSeconds     float64
	LastBytes       int64
	SpanDescription string
}

func newChart(samples []LagSample) chart {
	c := chart{Width: 600, Height: 120, Samples: len(samples)}
	if len(samples) == 0 {
		return c
	}
	c.HasSamples = true
	first, last := samples[0].At, samples[len(samples)-1].At
	c.From, c.To = first.UTC().Format("15:04:05"), last.UTC().Format("15:04:05")
	c.SpanDescription = last.Sub(first).Round(time.Second).String()
	for _, s := range samples {
		c.MaxSeconds = math.Max(c.MaxSeconds, s.LagSeconds)
		c.MaxBytes = max(c.MaxBytes, s.LagBytes)
	}
	span := last.Sub(first).Seconds()
	x := func(t time.Time) float64 {
		if span <= 0 {
			return float64(c.Width)
		}
		return t.Sub(first).Seconds() / span * float64(c.Width)
	}
	y := func(v, top float64) float64 {
		if top <= 0 {
			return float64(c.Height)
		}
		return float64(c.Height) - v/top*float64(c.Height-4)
	}
	var sp, bp strings.Builder
	for _, s := range samples {
		if !s.OK {
			c.Gaps = append(c.Gaps, x(s.At))
			continue
		}
		// The seconds axis reaches at least 1 s: a few milliseconds of lag
		// must not fill the chart.
		fmt.Fprintf(&sp, "%.1f,%.1f ", x(s.At), y(s.LagSeconds, max(c.MaxSeconds, 1)))
		fmt.Fprintf(&bp, "%.1f,%.1f ", x(s.At), y(float64(s.LagBytes), float64(c.MaxBytes)))
	}
	c.SecondsPoints, c.BytesPoints = strings.TrimSpace(sp.String()), strings.TrimSpace(bp.String())
	l := samples[len(samples)-1]
	c.LatestOK, c.LastSeconds, c.LastBytes = l.OK, l.LagSeconds, l.LagBytes
	return c
}
