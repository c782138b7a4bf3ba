package backoff

import (
	"testing"
	"time"
)

func TestDelayDoublesUpToTheCap(t *testing.T) {
	t.Parallel()
	p := Policy{Base: 100 * time.Millisecond, Factor: 2, Max: time.Second}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for n, w := range want {
		if got := p.DelayAt(n, 0); got != w*time.Millisecond {
			t.Errorf("DelayAt(%d) = %s, want %s", n, got, w*time.Millisecond)
		}
	}
	// A huge attempt number neither overflows nor exceeds the cap.
	if got := p.DelayAt(1<<30, 0.5); got > time.Second || got < 0 {
		t.Errorf("DelayAt(huge) = %s", got)
	}
}

func TestJitterOnlyShortens(t *testing.T) {
	t.Parallel()
	p := Policy{Base: time.Second, Factor: 2, Max: 8 * time.Second, Jitter: 0.5}
	if got := p.DelayAt(3, 0.999999); got < 4*time.Second || got > 8*time.Second {
		t.Errorf("DelayAt(3, ~1) = %s, want within [4s, 8s]", got)
	}
	for range 1000 {
		if d := p.Delay(2); d < 2*time.Second || d > 4*time.Second {
			t.Fatalf("Delay(2) = %s, want within [2s, 4s]", d)
		}
	}
}

func TestZeroFactorDoubles(t *testing.T) {
	t.Parallel()
	if got := (Policy{Base: time.Second, Max: time.Minute}).DelayAt(2, 0); got != 4*time.Second {
		t.Errorf("DelayAt(2) with Factor 0 = %s, want 4s", got)
	}
}
