package cdc

import (
	"testing"
	"time"
)

// TestParseUTCTimestampAgreesWithTimeParse: the stream's fast reading of a
// timestamptz gives what time.Parse gives, and leaves every other form to it.
func TestParseUTCTimestampAgreesWithTimeParse(t *testing.T) {
	for _, s := range []string{
		"2026-12-01 22:25:18.123456+00",
		"2026-12-01 22:25:18+00",
		"2026-12-01 22:25:18.1+00",
		"2024-02-29 00:00:00.000001+00",
		"1999-12-31 23:59:59.999999999+00",
		"0001-01-01 00:00:00+00",
	} {
		fast, ok := parseUTCTimestamp(s)
		if !ok {
			t.Fatalf("%q: not read", s)
		}
		want, err := time.Parse("2006-01-02 15:04:05.999999999-07", s)
		if err != nil {
			t.Fatal(err)
		}
		if !fast.Equal(want) || fast.Location() != time.UTC {
			t.Errorf("%q: %v, want %v", s, fast, want)
		}
		if got := parseTimestamp(s); !got.Equal(want) {
			t.Errorf("parseTimestamp(%q) = %v, want %v", s, got, want)
		}
	}
	for _, s := range []string{
		"2026-12-01 22:25:18.123456+02",     // another zone: time.Parse reads it
		"2026-12-01 22:25:18.123456+05:30",  // idem
		"2026-12-01 22:25:18.123456",        // timestamp without zone
		"2023-02-29 00:00:00+00",            // no such day
		"2026-12-01 24:00:00+00",            // no such hour
		"2026-12-01 22:25:18.+00",           // no fraction digits
		"2026-12-01 22:25:18.1234567890+00", // more than nanoseconds
		"infinity",
		"2026-12-01 22:25:18 BC+00",
		"12026-12-01 22:25:18+00",
	} {
		if got, ok := parseUTCTimestamp(s); ok {
			t.Errorf("%q read as %v: want it left to time.Parse", s, got)
		}
	}
	if got, want := parseTimestamp("2026-12-01 22:25:18.5+02"), time.Date(2026, 12, 1, 20, 25, 18, 5e8, time.UTC); !got.Equal(want) {
		t.Errorf("another zone: %v, want %v", got, want)
	}
}
