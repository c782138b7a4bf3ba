package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/a-h/templ"
	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/admin"
)

// The functions the page's templ components call. They return text, which
// the components escape; the URLs are built here from ids and query
// escaping, never from a value taken as it is.

// shortID is the part of an instance id that tells instances apart: its
// last 12 hex characters (a UUIDv7 begins with its creation time, the same
// for every instance of a minute). Search takes any end of 8 or more.
func shortID(id fmt.Stringer) string {
	s := id.String()
	return s[len(s)-12:]
}

// listReasonWidth is how much of a reason a list row shows; the detail page
// has it whole. `relay sagas list` cuts at the same width.
const listReasonWidth = 60

// clip is a reason as a list row shows it.
func clip(s string) string { return clipText(s, listReasonWidth) }

// clipText folds whitespace and cuts s to n characters, ending in "…".
func clipText(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// listAttempt is the attempt cell: none for an instance that has ended or
// waits for a person.
func listAttempt(it admin.Item) string {
	if it.Terminal() || it.Status == saga.StatusFailed {
		return "—"
	}
	return fmt.Sprint(it.Attempt)
}

// listNextAttempt is the next attempt cell: none for an instance that has
// ended, waits for a person or waits for a reply.
func listNextAttempt(it admin.Item) string {
	if it.Terminal() || it.Status == saga.StatusFailed || it.AwaitingReply {
		return "—"
	}
	return fmtTime(it.NextAttemptAt)
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func fmtTimePtr(t *time.Time) string {
	if t == nil {
		return "—"
	}
	return fmtTime(*t)
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func lower(s string) string { return strings.ToLower(s) }

// statusClass is the class of a status badge: its colour comes from
// app.css (s-running, s-failed, …).
func statusClass[S ~string](st S) string { return "status s-" + lower(string(st)) }

// instanceURL is an instance's detail page.
func instanceURL(id uuid.UUID) templ.SafeURL { return templ.SafeURL("/sagas/" + id.String()) }

// statusListURL is the list of a saga version's instances in one status,
// the overview's links.
func statusListURL(sagaName string, version int, st saga.Status) templ.SafeURL {
	return templ.SafeURL("/?saga=" + url.QueryEscape(sagaName) + "&version=" + strconv.Itoa(version) + "&status=" + url.QueryEscape(string(st)))
}

// atLeast writes a count that may have been cut at its cap: "100+".
func atLeast(n int64, more bool) string {
	s := strconv.FormatInt(n, 10)
	if more {
		s += "+"
	}
	return s
}

// textIf is s when cond holds, else nothing: text that joins its
// neighbours without the space a templ if block would put around it.
func textIf(cond bool, s string) string {
	if cond {
		return s
	}
	return ""
}

// versionValue fills the filter form's version field: empty for any.
func versionValue(v int) string {
	if v == 0 {
		return ""
	}
	return strconv.Itoa(v)
}

func fmtSeconds(f float64) string { return fmt.Sprintf("%.1f s", f) }

func fmtSecondsPtr(f *float64) string {
	if f == nil {
		return "seconds unknown (no checkpoint yet)"
	}
	return fmtSeconds(*f)
}

// bulkSummary says how many instances a filter matches and how many of
// them a retry or a cancel can act on.
func bulkSummary(d indexData) string {
	var b strings.Builder
	if d.MatchedMore {
		b.WriteString("More than ")
	}
	b.WriteString(strconv.FormatInt(d.Matched, 10))
	b.WriteString(" instances match")
	if d.Matched != 0 {
		fmt.Fprintf(&b, ": %s a retry can act on, %s a cancel can", atLeast(d.Retryable, d.RetryableMore), atLeast(d.Cancellable, d.CancellableMore))
	}
	b.WriteString(".")
	return b.String()
}

// stepClass is a step's class in the detail page's list of steps; the
// step the instance stands at is current.
func stepClass(st admin.Step, current int) string {
	c := "step st-" + lower(string(st.Status))
	if st.Sequence == current {
		c += " current"
	}
	return c
}

// stepTimes are a recorded step's times, for the detail page's list of
// steps.
func stepTimes(st admin.Step) string {
	if !st.Recorded {
		return ""
	}
	return " · started " + fmtTimePtr(st.StartedAt) + " · completed " + fmtTimePtr(st.CompletedAt) + " · compensated " + fmtTimePtr(st.CompensatedAt)
}

// canRetry mirrors admin.Retry's refusals, so that the page offers the
// button only where it can work (the API still decides).
func canRetry(it admin.Item) bool {
	switch it.Status {
	case saga.StatusCompleted, saga.StatusCompensated, saga.StatusTimedOut, saga.StatusPaused:
		return false
	}
	return it.StuckReason != admin.StuckUnregistered
}

func canCancel(st saga.Status) bool { return st == saga.StatusRunning }

func canPause(st saga.Status) bool {
	return st == saga.StatusRunning || st == saga.StatusCompensating
}

func canResume(st saga.Status) bool { return st == saga.StatusPaused }

func prettyJSON(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return string(raw)
	}
	return buf.String()
}

func stepNo(i *int) string {
	if i == nil || *i < 0 {
		return "—"
	}
	return fmt.Sprint(*i)
}

// eventNotes picks the fields of a journal payload a person reads first.
func eventNotes(raw json.RawMessage) string {
	var ev saga.Event
	if json.Unmarshal(raw, &ev) != nil {
		return ""
	}
	var parts []string
	if ev.Reason != "" {
		parts = append(parts, "reason: "+ev.Reason)
	}
	if ev.Actor != "" {
		parts = append(parts, "by "+ev.Actor)
	}
	if ev.Error != "" {
		parts = append(parts, "error: "+ev.Error)
	}
	if ev.RetryIn > 0 {
		parts = append(parts, "retry in "+saga.RoundDelay(ev.RetryIn).String())
	}
	if !ev.Until.IsZero() {
		parts = append(parts, "until "+ev.Until.UTC().Format(time.RFC3339))
	}
	if ev.AwaitFor > 0 {
		parts = append(parts, "awaits reply for "+saga.RoundDelay(ev.AwaitFor).String())
	}
	return strings.Join(parts, " · ")
}

// reasonClass is how an instance's reason is shown: a COMPENSATED
// instance's reason is why it was undone as designed (an expected
// outcome), in the text's colour; any other's is an error's, in red.
func reasonClass(st saga.Status) string {
	if st == saga.StatusCompensated {
		return "expected"
	}
	return "err"
}
