package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"log/slog"
)

// curveScenario is scenarios 4 and 5: stream + correlator over growing
// backlogs, each in a fresh child relay process (`relay-bench consume`) so
// that its peak RSS and CPU time are the relay's alone.
func (r *run) curveScenario(ctx context.Context) error {
	e := r.env
	for _, n := range r.sz.curve {
		if err := e.reset(ctx); err != nil {
			return err
		}
		slot := e.slotName("curve")
		if _, err := e.createSlot(ctx, slot, true); err != nil {
			return err
		}
		r.progress("curve: loading %d outbox rows, %d per transaction", n, r.sz.curveRowsPerTx)
		if err := e.load(ctx, n, r.sz.curveRowsPerTx, benchEventType, 0); err != nil {
			return err
		}
		e.checkpoint(ctx)
		p, err := r.curvePoint(ctx, slot, n)
		if err != nil {
			return fmt.Errorf("%d events: %w", n, err)
		}
		r.report.Curve = append(r.report.Curve, p)
		r.progress("curve: %d events: %.0f ev/s, peak RSS %.1f MB, %.2f CPU s per 100k events", n, p.EventsPerSec, p.PeakRSSMB, p.CPUPer100k)
	}
	if !r.report.Curve[len(r.report.Curve)-1].InProcess {
		return nil
	}
	r.report.Notes = append(r.report.Notes, "resources were measured inside the bench process (no child relay): peak RSS and CPU include the harness")
	return nil
}

func (r *run) curvePoint(ctx context.Context, slot string, n int) (CurvePoint, error) {
	p := CurvePoint{Events: n, RowsPerTx: r.sz.curveRowsPerTx}
	var (
		res   consumeResult
		usage Usage
		err   error
	)
	if len(r.cfg.ChildCommand) > 0 {
		res, usage, err = r.consumeInChild(ctx, slot, n)
	} else {
		m := startSelfMeter()
		res, err = consume(ctx, consumeOptions{URL: r.env.url, Publication: r.env.pub, Slot: slot,
			Registry: benchRegistry(nil), Want: n, Timeout: r.sz.timeout, Logger: r.log})
		usage = m.stop()
	}
	if err != nil {
		return p, err
	}
	p.Seconds = res.Took.Seconds()
	p.EventsPerSec = rate(n, res.Took)
	p.Batches = res.Batches
	p.PeakRSSMB = usage.PeakRSSMB()
	p.CPUSeconds = usage.CPU.Seconds()
	p.CPUPer100k = usage.CPU.Seconds() * 100000 / float64(n)
	p.InProcess = usage.InProcess
	return p, nil
}

// consumeInChild runs `relay-bench consume` and reads its rusage. The
// database URL goes through the environment, never the command line, where
// other users could read its password.
func (r *run) consumeInChild(ctx context.Context, slot string, n int) (consumeResult, Usage, error) {
	var res consumeResult
	args := append([]string{}, r.cfg.ChildCommand[1:]...)
	args = append(args, "--slot", slot, "--publication", r.env.pub, "--events", strconv.Itoa(n),
		"--timeout", r.sz.timeout.String())
	if r.cfg.CPUProfile != "" {
		args = append(args, "--cpuprofile", fmt.Sprintf("%s.consume-%d", r.cfg.CPUProfile, n))
	}
	cmd := exec.CommandContext(ctx, r.cfg.ChildCommand[0], args...)
	cmd.Env = append(os.Environ(), "RELAY_DATABASE_URL="+r.env.url)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return res, Usage{}, fmt.Errorf("child relay: %v: %s", err, lastLines(stderr.String(), 5))
	}
	usage, err := childUsage(cmd.ProcessState)
	if err != nil {
		return res, usage, err
	}
	out := strings.TrimSpace(stdout.String())
	if i := strings.LastIndexByte(out, '\n'); i >= 0 {
		out = out[i+1:]
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		return res, usage, fmt.Errorf("child relay printed %q, not its result: %v", out, err)
	}
	// The rusage's ru_maxrss is no good here: Go starts a child with
	// vfork, and Linux folds the resident set of the memory the child
	// shared with this process until exec into it, so it reports this
	// process's size. The child's own VmHWM is its alone.
	if res.PeakRSS > 0 {
		usage.PeakRSS = res.PeakRSS
	}
	return res, usage, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// ConsumeConfig configures Consume, the child side of the resources
// scenario.
type ConsumeConfig struct {
	DatabaseURL string
	Slot        string
	Publication string
	Events      int
	Timeout     time.Duration
	CPUProfile  string
	Logger      *slog.Logger
}

// Consume runs the relay's stream and correlator (the bench saga registered,
// no step runner) on a slot the parent prepared, until Events events are
// committed, and prints the result as one JSON line on out. It is what
// `relay-bench consume` runs in a child process.
func Consume(ctx context.Context, cfg ConsumeConfig, out io.Writer) error {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.DatabaseURL == "" || cfg.Slot == "" || cfg.Publication == "" || cfg.Events <= 0 {
		return fmt.Errorf("bench consume: --database-url, --slot, --publication and a positive --events are required")
	}
	if cfg.CPUProfile != "" {
		f, err := os.Create(cfg.CPUProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	res, err := consume(ctx, consumeOptions{URL: cfg.DatabaseURL, Publication: cfg.Publication, Slot: cfg.Slot,
		Registry: benchRegistry(nil), Want: cfg.Events, Timeout: cfg.Timeout, Logger: cfg.Logger})
	if err != nil {
		return err
	}
	res.PeakRSS = procStatusBytes("/proc/self/status", "VmHWM:")
	w := bufio.NewWriter(out)
	if err := json.NewEncoder(w).Encode(res); err != nil {
		return err
	}
	return w.Flush()
}
