package suggest

import "testing"

func TestDistance(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"", "abc", 3},
		{"list", "list", 0},
		{"lsit", "list", 1}, // a swap is one edit
		{"lst", "list", 1},
		{"listt", "list", 1},
		{"lisk", "list", 1},
		{"kitten", "sitting", 3},
		{"ca", "abc", 3}, // a swapped pair is not edited again (restricted distance)
		{"RUNNNING", "RUNNING", 1},
		{"débit", "debit", 1}, // letters, not bytes
	} {
		if got := Distance(tc.a, tc.b); got != tc.want {
			t.Errorf("Distance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
		if got := Distance(tc.b, tc.a); got != tc.want {
			t.Errorf("Distance(%q, %q) = %d, want %d (not symmetric)", tc.b, tc.a, got, tc.want)
		}
	}
}

func TestNearest(t *testing.T) {
	t.Parallel()
	statuses := []string{"RUNNING", "PAUSED", "COMPENSATING", "FAILED", "COMPLETED", "COMPENSATED", "TIMED_OUT"}
	for _, tc := range []struct {
		got     string
		choices []string
		want    string
	}{
		{"RUNNNING", statuses, "RUNNING"},
		{"running", statuses, "RUNNING"}, // case aside
		{"COMPENSATE", statuses, "COMPENSATED"},
		{"bogus-word", statuses, ""},
		{"intervl", []string{"interval", "json", "follow"}, "interval"},
		{"inter", []string{"interval", "json", "follow"}, "interval"}, // the start of a choice
		{"i", []string{"interval", "json", "follow"}, ""},             // one letter is no start
		{"verbose", []string{"debug", "info", "warn", "error"}, ""},
		{"x", nil, ""},
	} {
		if got := Nearest(tc.got, tc.choices); got != tc.want {
			t.Errorf("Nearest(%q) = %q, want %q", tc.got, got, tc.want)
		}
	}
}
