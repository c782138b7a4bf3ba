package httpapi

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/compensa/compensa/saga/admin"
)

// The page's charts, drawn as inline SVG: the last hour of outcomes and
// the replication lag. Each has a y axis with labelled ticks in its unit
// (the lag chart a second one on the right, for bytes) and an x axis of
// UTC times.

// plotArea is a chart's geometry: the whole SVG and the rectangle the
// lines are drawn in, with room for the axes' labels around it.
type plotArea struct {
	Width, Height          int
	Left, Right, Top, Base float64
}

func newPlotArea(rightAxis bool) plotArea {
	p := plotArea{Width: 680, Height: 176, Left: 58, Top: 10}
	p.Right = float64(p.Width) - 12
	if rightAxis {
		p.Right = float64(p.Width) - 70
	}
	p.Base = float64(p.Height) - 36
	return p
}

// PlotWidth and PlotHeight size the plot's frame.
func (p plotArea) PlotWidth() float64  { return p.Right - p.Left }
func (p plotArea) PlotHeight() float64 { return p.Base - p.Top }

// Positions of the axes' marks and labels, for the charts' components
// (page_charts.templ).
func (p plotArea) TickIn() float64     { return p.Left - 4 }
func (p plotArea) LabelLeft() float64  { return p.Left - 7 }
func (p plotArea) TickOut() float64    { return p.Right + 4 }
func (p plotArea) LabelRight() float64 { return p.Right + 7 }
func (p plotArea) TickDown() float64   { return p.Base + 4 }
func (p plotArea) LabelBelow() float64 { return p.Base + 16 }
func (p plotArea) TitleBelow() float64 { return float64(p.Height) - 3 }
func (p plotArea) MidY() float64       { return (p.Top + p.Base) / 2 }

// y places v of an axis reaching top.
func (p plotArea) y(v, top float64) float64 {
	if top <= 0 {
		return p.Base
	}
	return p.Base - v/top*p.PlotHeight()
}

// tick is one labelled mark of an axis: At is its x (x axis) or y (y axis).
type tick struct {
	At    float64
	Label string
}

// niceTop rounds top up to 1, 2 or 5 times a power of ten and returns it
// with the step of about n ticks up to it.
func niceTop(top float64, n int) (ceil, step float64) {
	if top <= 0 {
		top = 1
	}
	raw := top / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if step = m * mag; step >= raw {
			break
		}
	}
	return math.Ceil(top/step-1e-9) * step, step
}

// yTicks labels an axis from 0 to ceil by step, each label formatted by
// label and placed on the left (x = Left) or the right axis.
func (p plotArea) yTicks(ceil, step float64, label func(float64) string) []tick {
	var out []tick
	for v := 0.0; v <= ceil+step/2; v += step {
		out = append(out, tick{At: p.y(v, ceil), Label: label(v)})
	}
	return out
}

// xTicks labels the x axis from first to last with about n times,
// rounded to a whole step.
func (p plotArea) xTicks(first, last time.Time, n int, layout string) []tick {
	span := last.Sub(first)
	if span <= 0 {
		return []tick{{At: p.Right, Label: last.UTC().Format(layout)}}
	}
	step := time.Second
	for _, s := range []time.Duration{time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second, 30 * time.Second,
		time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute, time.Hour} {
		if step = s; span/s <= time.Duration(n) {
			break
		}
	}
	var out []tick
	for t := first.Truncate(step); !t.After(last); t = t.Add(step) {
		if t.Before(first) {
			continue
		}
		out = append(out, tick{At: p.Left + t.Sub(first).Seconds()/span.Seconds()*p.PlotWidth(), Label: t.UTC().Format(layout)})
	}
	return out
}

// overviewChart draws the last hour per minute: started, completed,
// compensated and failed, one polyline each, in instances per minute.
type overviewChart struct {
	plotArea
	Started, Completed, Compensated, Failed                     string
	Max                                                         int64
	From, To                                                    string
	TotalStarted, TotalCompleted, TotalCompensated, TotalFailed int64
	YTicks, XTicks                                              []tick
}

func newOverviewChart(ms []admin.MinuteCounts) overviewChart {
	c := overviewChart{plotArea: newPlotArea(false)}
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
	// Counts are whole: the axis steps by at least one instance.
	top, step := niceTop(float64(max(c.Max, 1)), 4)
	if step < 1 {
		top, step = math.Max(math.Ceil(top), 1), 1
	}
	c.YTicks = c.yTicks(top, step, func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) })
	c.XTicks = c.xTicks(ms[0].Minute, ms[len(ms)-1].Minute, 6, "15:04")
	x := func(i int) float64 {
		return c.Left + float64(i)/float64(max(len(ms)-1, 1))*c.PlotWidth()
	}
	line := func(v func(admin.MinuteCounts) int64) string {
		var b strings.Builder
		for i, m := range ms {
			fmt.Fprintf(&b, "%.1f,%.1f ", x(i), c.y(float64(v(m)), top))
		}
		return strings.TrimSpace(b.String())
	}
	c.Started = line(func(m admin.MinuteCounts) int64 { return m.Started })
	c.Completed = line(func(m admin.MinuteCounts) int64 { return m.Completed })
	c.Compensated = line(func(m admin.MinuteCounts) int64 { return m.Compensated })
	c.Failed = line(func(m admin.MinuteCounts) int64 { return m.Failed })
	return c
}

// chart is the lag chart, drawn as an inline SVG from the kept samples:
// seconds on the left axis, bytes on the right one.
type chart struct {
	plotArea
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
	// SecondsTicks label the left axis, BytesTicks the right one (their
	// unit, KiB or MiB…, follows the largest sample), XTicks the times.
	SecondsTicks, BytesTicks, XTicks []tick
	BytesUnit                        string
}

// byteUnit picks the binary unit the bytes axis counts in.
func byteUnit(n int64) (float64, string) {
	div, unit := 1.0, "B"
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB"} {
		if float64(n) < div*1024 {
			break
		}
		div, unit = div*1024, u
	}
	return div, unit
}

func newChart(samples []LagSample) chart {
	c := chart{plotArea: newPlotArea(true), Samples: len(samples)}
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
	// The seconds axis reaches at least 1 s: a few milliseconds of lag
	// must not fill the chart.
	secTop, secStep := niceTop(math.Max(c.MaxSeconds, 1), 4)
	c.SecondsTicks = c.yTicks(secTop, secStep, func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) + " s" })
	div, unit := byteUnit(c.MaxBytes)
	c.BytesUnit = unit
	byteTop, byteStep := niceTop(math.Max(float64(c.MaxBytes)/div, 1), 4)
	c.BytesTicks = c.yTicks(byteTop, byteStep, func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) + " " + unit })
	c.XTicks = c.xTicks(first, last, 6, "15:04:05")
	span := last.Sub(first).Seconds()
	x := func(t time.Time) float64 {
		if span <= 0 {
			return c.Right
		}
		return c.Left + t.Sub(first).Seconds()/span*c.PlotWidth()
	}
	var sp, bp strings.Builder
	for _, s := range samples {
		if !s.OK {
			c.Gaps = append(c.Gaps, x(s.At))
			continue
		}
		fmt.Fprintf(&sp, "%.1f,%.1f ", x(s.At), c.y(s.LagSeconds, secTop))
		fmt.Fprintf(&bp, "%.1f,%.1f ", x(s.At), c.y(float64(s.LagBytes)/div, byteTop))
	}
	c.SecondsPoints, c.BytesPoints = strings.TrimSpace(sp.String()), strings.TrimSpace(bp.String())
	l := samples[len(samples)-1]
	c.LatestOK, c.LastSeconds, c.LastBytes = l.OK, l.LagSeconds, l.LagBytes
	return c
}
