package cliflag

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"
)

// Int is a whole-number flag between a least and a most value.
type Int struct {
	p           *int
	least, most int
}

// IntAtLeast returns an Int that stores into p, which starts as def, and
// takes least or more.
func IntAtLeast(p *int, def, least int) *Int { return IntBetween(p, def, least, math.MaxInt) }

// IntBetween returns an Int that stores into p, which starts as def, and
// takes least to most.
func IntBetween(p *int, def, least, most int) *Int {
	*p = def
	return &Int{p: p, least: least, most: most}
}

func (v *Int) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || n < v.least || n > v.most {
		return errors.New(v.Want())
	}
	*v.p = n
	return nil
}

func (v *Int) Want() string {
	if v.most == math.MaxInt {
		return fmt.Sprintf("want a whole number of at least %d", v.least)
	}
	return fmt.Sprintf("want a whole number from %d to %d", v.least, v.most)
}

func (v *Int) String() string { return strconv.Itoa(*v.p) }
func (v *Int) Type() string   { return "int" }

// Range is the least and the most value the flag takes (math.MaxInt: no
// bound).
func (v *Int) Range() (least, most int) { return v.least, v.most }

// Duration is a duration flag that is never negative, and zero only where
// zero means something (off, keep forever).
type Duration struct {
	p      *time.Duration
	zeroOK bool
	want   string
}

// PositiveDuration returns a Duration that stores into p, which starts as
// def, and takes only a positive duration: an interval, a timeout.
func PositiveDuration(p *time.Duration, def time.Duration) *Duration {
	*p = def
	return &Duration{p: p, want: "want a positive duration such as 30s, 5m or 1h"}
}

// OptionalDuration is a Duration whose 0 turns off what it times.
func OptionalDuration(p *time.Duration, def time.Duration) *Duration {
	*p = def
	return &Duration{p: p, zeroOK: true, want: "want a duration such as 30s, 5m or 24h, or 0 for off"}
}

// Retention is a Duration that says how long to keep something; its 0 keeps
// it forever.
func Retention(p *time.Duration, def time.Duration) *Duration {
	*p = def
	return &Duration{p: p, zeroOK: true, want: "want a duration such as 1h, 24h or 720h, or 0 to keep forever"}
}

func (v *Duration) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 || (d == 0 && !v.zeroOK) {
		return errors.New(v.want)
	}
	*v.p = d
	return nil
}

func (v *Duration) Want() string { return v.want }

// String writes zero as 0, not 0s: pflag leaves a default of "0" out of
// --help, as it does for its own durations.
func (v *Duration) String() string {
	if *v.p == 0 {
		return "0"
	}
	return v.p.String()
}

func (v *Duration) Type() string { return "duration" }

// ZeroOK says whether the flag takes 0.
func (v *Duration) ZeroOK() bool { return v.zeroOK }
