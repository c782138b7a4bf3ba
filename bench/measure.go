package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Latencies collects latency samples. Percentiles come from the sorted
// samples (nearest rank): at the sizes measured here (at most a few hundred
// thousand samples) that is exact and costs a few megabytes, so an HDR
// histogram would add a dependency without earning its place.
type Latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

// Add records one sample. Safe for concurrent use.
func (l *Latencies) Add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

// LatencySummary is the distribution of a set of samples, in milliseconds.
type LatencySummary struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50_ms"`
	P95   float64 `json:"p95_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
}

// Summary returns the percentiles of the samples recorded so far.
func (l *Latencies) Summary() LatencySummary {
	l.mu.Lock()
	d := slices.Clone(l.d)
	l.mu.Unlock()
	return summarize(d)
}

func summarize(d []time.Duration) LatencySummary {
	if len(d) == 0 {
		return LatencySummary{}
	}
	slices.Sort(d)
	return LatencySummary{
		Count: len(d),
		P50:   ms(percentile(d, 0.50)),
		P95:   ms(percentile(d, 0.95)),
		P99:   ms(percentile(d, 0.99)),
		Max:   ms(d[len(d)-1]),
	}
}

// percentile returns the nearest-rank percentile p (0 < p ≤ 1) of sorted.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(p*float64(len(sorted))+0.999999999) - 1
	rank = max(0, min(rank, len(sorted)-1))
	return sorted[rank]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Usage is what a process (or a phase of this one) consumed.
type Usage struct {
	// PeakRSS is the resident set's high-water mark in bytes.
	PeakRSS int64
	// CPU is user plus system time.
	CPU time.Duration
	// InProcess is true when the figures are this process's (the bench
	// harness included), false when they are a child relay's alone.
	InProcess bool
}

// PeakRSSMB is PeakRSS in mebibytes.
func (u Usage) PeakRSSMB() float64 { return float64(u.PeakRSS) / (1 << 20) }

// childUsage reads a finished child's rusage: Maxrss is in kilobytes on
// Linux, and an overestimate for a child started by Go (see consumeInChild).
func childUsage(ps *os.ProcessState) (Usage, error) {
	if ps == nil {
		return Usage{}, fmt.Errorf("bench: child has not exited")
	}
	ru, ok := ps.SysUsage().(*syscall.Rusage)
	if !ok || ru == nil {
		return Usage{}, fmt.Errorf("bench: no resource usage for the child on this platform")
	}
	return Usage{
		PeakRSS: ru.Maxrss * 1024,
		CPU:     ps.UserTime() + ps.SystemTime(),
	}, nil
}

// selfMeter measures a phase of this process: CPU time from getrusage, and
// the RSS high-water mark from /proc/self/status after resetting it through
// /proc/self/clear_refs (Linux ≥ 4.0), so that an earlier phase's peak does
// not count.
type selfMeter struct {
	cpu0  time.Duration
	reset bool
}

func startSelfMeter() selfMeter {
	err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
	return selfMeter{cpu0: selfCPU(), reset: err == nil}
}

// stop returns the phase's usage. When the high-water mark could not be
// reset, the figure is the process's lifetime peak, an upper bound.
func (m selfMeter) stop() Usage {
	return Usage{PeakRSS: procStatusBytes("/proc/self/status", "VmHWM:"), CPU: selfCPU() - m.cpu0, InProcess: true}
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procStatusBytes reads a "Name:   123 kB" line of a /proc status file.
func procStatusBytes(path, key string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, key) {
			continue
		}
		f := strings.Fields(strings.TrimPrefix(line, key))
		if len(f) == 0 {
			return 0
		}
		n, _ := strconv.ParseInt(f[0], 10, 64)
		if len(f) > 1 && strings.EqualFold(f[1], "kB") {
			n *= 1024
		}
		return n
	}
	return 0
}

// loadAverage returns the 1-minute load average, or -1.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}

// rate is events per second, 0 when nothing was timed.
func rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// share is part/whole, 0 when whole is zero.
func share(part, whole time.Duration) float64 {
	if whole <= 0 {
		return 0
	}
	return float64(part) / float64(whole)
}

// median of v (the mean of the two middle values for an even count), 0 for
// none.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// spread is (max − min) / median of v: how far apart the passes behind a
// median figure landed; nil for fewer than two passes, which say nothing
// about it.
func spread(v []float64) *float64 {
	if len(v) < 2 {
		return nil
	}
	m := median(v)
	if m == 0 {
		return nil
	}
	return f64((slices.Max(v) - slices.Min(v)) / m)
}

// unreliableSpread is the spread above which a figure's passes disagree too
// much for a target to be called met or missed on it.
const unreliableSpread = 0.15
