package bench

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
	"strings"
)

// writeSoakPlot draws the soak runs as one SVG (no dependency: the format is
// text): three panels over the minutes since the producer started — sagas
// completed per second, p99 of trigger commit → COMPLETED, and the relay's
// tables' megabytes — one line per run.
func writeSoakPlot(w io.Writer, runs []SoakRun) error {
	const (
		width, panelH, left, right, top, gap = 960, 220, 80, 200, 50, 60
	)
	type line struct {
		name  string
		color string
		x, y  []float64
	}
	colors := []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd"}
	var tput, p99, bytes []line
	xMax := 0.0
	for i, run := range runs {
		c := colors[i%len(colors)]
		label := fmt.Sprintf("%s (%d sagas at %d/s)", run.Name, run.Sagas, run.Rate)
		t, p, b := line{name: label, color: c}, line{name: label, color: c}, line{name: label, color: c}
		for _, k := range run.Buckets {
			t.x, t.y = append(t.x, k.T/60), append(t.y, k.SagasPerSec)
			if k.EndP99Ms != nil {
				p.x, p.y = append(p.x, k.T/60), append(p.y, *k.EndP99Ms)
			}
			xMax = max(xMax, k.T/60)
		}
		for _, s := range run.Samples {
			if s.TableBytes >= 0 {
				b.x, b.y = append(b.x, s.T/60), append(b.y, float64(s.TableBytes)/(1<<20))
				xMax = max(xMax, s.T/60)
			}
		}
		tput, p99, bytes = append(tput, t), append(p99, p), append(bytes, b)
	}
	xTicks := niceTicks(xMax)
	if len(xTicks) < 2 {
		xTicks = []float64{0, 1}
	}
	xHi := xTicks[len(xTicks)-1]
	panels := []struct {
		title string
		lines []line
	}{
		{"sagas completed per second", tput},
		{"end latency p99 (ms, trigger commit → COMPLETED)", p99},
		{"relay tables (MB: saga_*, relay_*, outbox, with indexes)", bytes},
	}
	height := top + len(panels)*(panelH+gap)
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(bw, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(bw, `<text x="%d" y="24" font-size="16">relay-bench: soak (x: minutes since the producer started)</text>`+"\n", left)
	plotW := float64(width - left - right)
	for pi, panel := range panels {
		y0 := float64(top + pi*(panelH+gap) + 20)
		yMax := 0.0
		for _, l := range panel.lines {
			for _, v := range l.y {
				yMax = max(yMax, v)
			}
		}
		yTicks := niceTicks(yMax)
		if len(yTicks) < 2 {
			yTicks = []float64{0, 1}
		}
		yHi := yTicks[len(yTicks)-1]
		px := func(x float64) float64 { return float64(left) + plotW*x/xHi }
		py := func(y float64) float64 { return y0 + float64(panelH)*(1-y/yHi) }
		fmt.Fprintf(bw, `<text x="%d" y="%.0f" font-size="13">%s</text>`+"\n", left, y0-6, html.EscapeString(panel.title))
		for _, t := range yTicks {
			fmt.Fprintf(bw, `<line x1="%d" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#ddd"/>`, left, px(xHi), py(t), py(t))
			fmt.Fprintf(bw, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, py(t)+4, tickLabel(t))
		}
		for _, t := range xTicks {
			fmt.Fprintf(bw, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#eee"/>`, px(t), px(t), y0, py(0))
			fmt.Fprintf(bw, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", px(t), py(0)+16, tickLabel(t))
		}
		fmt.Fprintf(bw, `<rect x="%d" y="%.1f" width="%.1f" height="%d" fill="none" stroke="#888"/>`+"\n", left, y0, plotW, panelH)
		for li, l := range panel.lines {
			if len(l.x) == 0 {
				continue
			}
			var pts strings.Builder
			for i := range l.x {
				fmt.Fprintf(&pts, "%.1f,%.1f ", px(l.x[i]), py(l.y[i]))
			}
			fmt.Fprintf(bw, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", l.color, strings.TrimSpace(pts.String()))
			ly := y0 + 14 + float64(li)*32
			fmt.Fprintf(bw, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s" stroke-width="3"/>`, px(xHi)+10, px(xHi)+30, ly-4, ly-4, l.color)
			name, rest, _ := strings.Cut(l.name, " (")
			fmt.Fprintf(bw, `<text x="%.1f" y="%.1f">%s</text>`, px(xHi)+36, ly, html.EscapeString(name))
			if rest != "" {
				fmt.Fprintf(bw, `<text x="%.1f" y="%.1f" font-size="10" fill="#555">%s</text>`, px(xHi)+36, ly+13, html.EscapeString("("+rest))
			}
			fmt.Fprintln(bw)
		}
	}
	fmt.Fprintln(bw, `</svg>`)
	return bw.Flush()
}

// niceTicks returns axis ticks from 0 to a round value at or above hi, 4 to
// 10 of them, spaced 1, 2 or 5 times a power of ten.
func niceTicks(hi float64) []float64 {
	if !(hi > 0) || math.IsInf(hi, 0) {
		return []float64{0, 1}
	}
	raw := hi / 5
	pow := math.Pow(10, math.Floor(math.Log10(raw)))
	step := pow * 10
	for _, m := range []float64{1, 2, 5, 10} {
		if pow*m >= raw {
			step = pow * m
			break
		}
	}
	n := int(math.Ceil(hi/step - 1e-9))
	ticks := make([]float64, n+1)
	for i := range ticks {
		ticks[i] = float64(i) * step
	}
	return ticks
}

func tickLabel(v float64) string {
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.3f", v), "0"), ".")
}
