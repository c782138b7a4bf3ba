package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/admin"
)

// The functions the page's templates call.

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

// canRetry mirrors admin.Retry's refusals, so that the page offers the
// button only where it can work (the API still decides).
func canRetry(it admin.Item) bool {
	switch it.Status {
	case saga.StatusCompleted, saga.StatusCompensated, saga.StatusTimedOut, saga.StatusPaused:
		return false
	}
	return it.StuckReason != admin.StuckUnregistered
}

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
