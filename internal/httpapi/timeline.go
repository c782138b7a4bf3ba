package httpapi

import (
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/admin"
)

// The detail page's timeline: every step attempt and compensation as a bar
// on one time axis, drawn on the server as SVG (the page's CSP allows no
// inline style, so bars take their colours from classes in app.css).
//
// The journal records when an attempt ended, not when it began; a bar
// starts at the instance's previous journal entry, or, after a failure, when
// its backoff ended, whichever is later (the instance's creation for the
// first one). That is when the runner could have started it at the soonest,
// so a bar is never shorter than the attempt; a gap before a claim shows in
// it.

// timeline is what sagaTimeAxis (page_saga.templ) draws.
type timeline struct {
	Width, Height int
	LabelWidth    int
	Lanes         []timelineLane
	Bars          []timelineBar
	Ticks         []timelineTick
	Span          string // the axis' length, e.g. "912 ms"
	From          string // the axis' origin, to the millisecond
	Waiting       bool   // a step still waits for a reply (the axis ends now)
	Empty         bool
	// Took says, per step index, how long its attempts (backoffs and
	// waits included) and its compensation took, for the steps list.
	Took map[int]string
}

type timelineLane struct {
	Y     int
	TextY int
	Label string
}

type timelineBar struct {
	X, Y, W, H float64
	// Class: attempt-ok, attempt-failed, attempt-interrupted, backoff,
	// waiting, comp-ok, comp-failed.
	Class string
	// Title is the bar's tooltip: what it is and how long it took.
	Title string
	// Kind and Step name the bar for tests and people (data-kind,
	// data-step).
	Kind string
	Step string
	Ms   int64
}

type timelineTick struct {
	X      float64
	Label  string
	Anchor string // text-anchor class: tick-mid, or tick-end for the last
}

const (
	timelineWidth = 900
	timelineLabel = 190
	laneHeight    = 22
	barHeight     = 14
	axisHeight    = 20
)

// fmtMs says a duration in milliseconds, or seconds from 10 s on.
func fmtMs(d time.Duration) string {
	if d < 10*time.Second {
		return fmt.Sprintf("%d ms", d.Milliseconds())
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}

// newTimeline lays out d's journal. now ends the bar of a step still
// waiting for a reply.
func newTimeline(d admin.Detail) timeline {
	return layoutTimeline(d, time.Now())
}

func layoutTimeline(d admin.Detail, now time.Time) timeline {
	tl := timeline{Width: timelineWidth, LabelWidth: timelineLabel}
	in := d.Instance
	names := map[int]string{}
	for _, s := range d.Steps {
		names[s.Sequence] = s.Name
	}
	name := func(i int) string {
		if n := names[i]; n != "" {
			return n
		}
		return fmt.Sprintf("step %d", i)
	}
	type span struct {
		from, to   time.Time
		class      string
		kind       string
		step, lane int
		title      string
	}
	var spans []span
	laneOf := map[string]int{}
	var laneKeys []struct {
		key   string
		step  int
		comp  bool
		label string
	}
	lane := func(step int, comp bool) int {
		key := fmt.Sprintf("%d/%t", step, comp)
		if i, ok := laneOf[key]; ok {
			return i
		}
		label := fmt.Sprintf("%d %s", step, name(step))
		if comp {
			label = "↩ " + label + " (undo)"
		}
		laneOf[key] = len(laneKeys)
		laneKeys = append(laneKeys, struct {
			key   string
			step  int
			comp  bool
			label string
		}{key, step, comp, label})
		return laneOf[key]
	}

	cursor := in.CreatedAt
	var due time.Time
	attempts := map[string]int{}
	var waitFrom time.Time
	waitStep := -1
	end := in.CreatedAt
	for _, e := range d.Events {
		var ev saga.Event
		_ = json.Unmarshal(e.Payload, &ev)
		at := e.CreatedAt
		if at.After(end) {
			end = at
		}
		step := -1
		if e.Step != nil {
			step = *e.Step
		}
		start := cursor
		if due.After(start) && due.Before(at) {
			start = due
		}
		add := func(comp bool, class, kind string, failed string) {
			key := fmt.Sprintf("%d/%t", step, comp)
			attempts[key]++
			what := "attempt"
			if comp {
				what = "compensation attempt"
			}
			title := fmt.Sprintf("%s: %s %d, %s", name(step), what, attempts[key], fmtMs(at.Sub(start)))
			if failed != "" {
				title += " — failed: " + failed
			}
			spans = append(spans, span{from: start, to: at, class: class, kind: kind, step: step, lane: lane(step, comp), title: title})
		}
		backoff := func(comp bool) {
			due = time.Time{}
			if ev.RetryIn <= 0 {
				return
			}
			due = at.Add(ev.RetryIn)
			spans = append(spans, span{from: at, to: due, class: "backoff", kind: "backoff", step: step, lane: lane(step, comp),
				title: fmt.Sprintf("%s: backoff %s before the next attempt", name(step), fmtMs(ev.RetryIn))})
			if due.After(end) {
				end = due
			}
		}
		switch e.Kind {
		case saga.EventStepCompleted:
			add(false, "attempt-ok", "attempt", "")
			due = time.Time{}
		case saga.EventStepFailed:
			add(false, "attempt-failed", "attempt", ev.Error)
			backoff(false)
		case saga.EventStepInterrupted:
			// Its end is not known: the bar runs until the next holder
			// found the step open.
			add(false, "attempt-interrupted", "attempt", "")
			spans[len(spans)-1].title += " — interrupted: its relay's lease was lost while it may have been running; it counts as one that may have acted"
			due = time.Time{}
		case saga.EventStepAwaiting:
			add(false, "attempt-ok", "attempt", "")
			waitFrom, waitStep = at, step
			due = time.Time{}
		case saga.EventReplyReceived:
			if waitStep >= 0 {
				spans = append(spans, span{from: waitFrom, to: at, class: "waiting", kind: "waiting", step: waitStep, lane: lane(waitStep, false),
					title: fmt.Sprintf("%s: waited %s for a reply", name(waitStep), fmtMs(at.Sub(waitFrom)))})
				waitStep = -1
			}
		case saga.EventStepCompensated:
			add(true, "comp-ok", "compensation", "")
			due = time.Time{}
		case saga.EventCompensationFailed:
			add(true, "comp-failed", "compensation", ev.Error)
			backoff(true)
		case saga.EventCompensationStarted, saga.EventRetryRequested, saga.EventCancelRequested:
			due = time.Time{}
			if waitStep >= 0 {
				spans = append(spans, span{from: waitFrom, to: at, class: "waiting", kind: "waiting", step: waitStep, lane: lane(waitStep, false),
					title: fmt.Sprintf("%s: waited %s for a reply, then %s", name(waitStep), fmtMs(at.Sub(waitFrom)), e.Kind)})
				waitStep = -1
			}
		}
		cursor = at
	}
	if waitStep >= 0 && !in.Status.Terminal() {
		// Still waiting: the bar runs to now.
		spans = append(spans, span{from: waitFrom, to: now, class: "waiting", kind: "waiting", step: waitStep, lane: lane(waitStep, false),
			title: fmt.Sprintf("%s: waiting for a reply for %s so far", name(waitStep), fmtMs(now.Sub(waitFrom)))})
		tl.Waiting = true
		if now.After(end) {
			end = now
		}
	}
	if in.CompletedAt != nil && in.CompletedAt.After(end) {
		end = *in.CompletedAt
	}
	if len(spans) == 0 {
		tl.Empty = true
		return tl
	}

	// Lanes in step order, each step's compensation right below it.
	order := make([]int, len(laneKeys))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool {
		ka, kb := laneKeys[order[a]], laneKeys[order[b]]
		if ka.step != kb.step {
			return ka.step < kb.step
		}
		return !ka.comp && kb.comp
	})
	row := make([]int, len(laneKeys))
	for r, i := range order {
		row[i] = r
		y := axisHeight + r*laneHeight
		tl.Lanes = append(tl.Lanes, timelineLane{Y: y, TextY: y + barHeight - 2, Label: laneKeys[i].label})
	}
	tl.Height = axisHeight + len(laneKeys)*laneHeight + 4

	origin := in.CreatedAt
	total := end.Sub(origin)
	if total <= 0 {
		total = time.Millisecond
	}
	plot := float64(tl.Width - tl.LabelWidth - 10)
	x := func(t time.Time) float64 {
		return float64(tl.LabelWidth) + float64(t.Sub(origin))/float64(total)*plot
	}
	for _, s := range spans {
		x0, x1 := x(s.from), x(s.to)
		w := max(x1-x0, 2) // a bar of a millisecond stays visible
		tl.Bars = append(tl.Bars, timelineBar{X: x0, Y: float64(axisHeight + row[s.lane]*laneHeight), W: w, H: barHeight,
			Class: s.class, Title: s.title, Kind: s.kind, Step: name(s.step), Ms: s.to.Sub(s.from).Milliseconds()})
	}
	for i := 0; i <= 4; i++ {
		at := time.Duration(float64(total) * float64(i) / 4)
		anchor := "tick-mid"
		if i == 4 {
			anchor = "tick-end"
		}
		tl.Ticks = append(tl.Ticks, timelineTick{X: float64(tl.LabelWidth) + plot*float64(i)/4, Label: "+" + fmtMs(at), Anchor: anchor})
	}
	// Per step: from its first bar to its last, forwards and undoing.
	type extent struct{ from, to time.Time }
	fwd, back := map[int]extent{}, map[int]extent{}
	for _, sp := range spans {
		m := fwd
		if sp.kind == "compensation" || laneKeys[sp.lane].comp {
			m = back
		}
		e, ok := m[sp.step]
		if !ok || sp.from.Before(e.from) {
			e.from = sp.from
		}
		if sp.to.After(e.to) {
			e.to = sp.to
		}
		m[sp.step] = e
	}
	tl.Took = map[int]string{}
	for step, e := range fwd {
		tl.Took[step] = fmtMs(e.to.Sub(e.from))
	}
	for step, e := range back {
		undo := "undone in " + fmtMs(e.to.Sub(e.from))
		if t := tl.Took[step]; t != "" {
			undo = t + ", " + undo
		}
		tl.Took[step] = undo
	}
	tl.Span = fmtMs(total)
	tl.From = origin.UTC().Format("2006-01-02 15:04:05.000Z")
	return tl
}

// journalGap is the time since the previous journal entry, for the
// journal table's duration column ("—" for the first).
func journalGap(events []admin.Event, i int) string {
	if i <= 0 || i >= len(events) {
		return "—"
	}
	return "+" + fmtMs(events[i].CreatedAt.Sub(events[i-1].CreatedAt))
}

// fmtTimeMs is fmtTime to the millisecond, for the journal.
func fmtTimeMs(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}
