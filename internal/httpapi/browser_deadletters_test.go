package httpapi_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/compensa/compensa/internal/httpapi"
	"github.com/compensa/compensa/saga"
)

// TestBrowserDeadLettersAndAxes opens the monitor's pages in a headless
// Chromium at 1400×900: the instances page (the ready state at the top,
// both charts with labelled axes), the dead letters page (the dead
// letters, the parked events with their skip buttons, the event outcome
// counts, the not-ready state with its reason once the relay stalls), the
// definitions page and one saga. It skips a parked event through the
// confirm dialog. Screenshots go to artefactDir as page-*-1400x900.png.
func TestBrowserDeadLettersAndAxes(t *testing.T) {
	requireChromium(t)
	var stalled atomic.Bool
	var n atomic.Int64
	b := setup(t, options{token: token, journal: true, configure: func(c *httpapi.Config) {
		c.LagSampleInterval = 50 * time.Millisecond
		c.Replication = func(context.Context) (httpapi.ReplicationStatus, error) {
			i := n.Add(1)
			return httpapi.ReplicationStatus{Slot: "relay_outbox", Exists: true, Active: true, WALStatus: "reserved",
				LagBytes: 300_000 + (i%9)*250_000, LagSeconds: ptr(0.2 + float64(i%7)*0.4)}, nil
		}
		c.Health = func() []string {
			if stalled.Load() {
				return []string{"stream: stalled for 2m10s: sink hook refuses the batch (POST answered 503)"}
			}
			return nil
		}
	}})
	sc := &scoped{testBundle: b}
	sc.seedDeadLetters(t)
	sc.seedParked(t)
	b.metrics.SetSources(httpapi.Sources{Outcomes: func() httpapi.EventOutcomes {
		return httpapi.EventOutcomes{Started: 1204, Reply: 3311, Ignored: 87, Filtered: 12, Parked: 4}
	}})
	id := b.insert(t, tenantA, saga.StatusFailed, 1, 0)
	b.insert(t, tenantA, saga.StatusRunning, 1, 0)
	if _, err := b.db.Pool.Exec(context.Background(), `UPDATE saga_instances SET created_at = now() - interval '20 minutes'
		WHERE status = 'RUNNING'; UPDATE saga_instances SET completed_at = now() - interval '5 minutes' WHERE status = 'FAILED'`); err != nil {
		t.Fatal(err)
	}
	// A few lag samples for the chart's time axis.
	rctx, stopRun := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- b.srv.Run(rctx) }()
	time.Sleep(1500 * time.Millisecond)
	stopRun()
	<-runDone

	dir := artefactDir(t)
	ctx := browserAt(t, b.ts.URL+"/login", 1400, 900, 2*time.Minute)
	css := func(sel string) chromedp.CSS { return chromedp.CSS(sel) }
	if err := chromedp.Do(ctx, chromedp.WaitVisible(css("#token")), chromedp.SendKeys(css("#token"), token),
		chromedp.Click(css("#login")), chromedp.WaitVisible(css("#recent"))); err != nil {
		t.Fatalf("browser: sign in: %v", err)
	}
	count := func(sel string) int {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll(`+strconv.Quote(sel)+`).length`))
		if err != nil {
			t.Fatalf("count %s: %v", sel, err)
		}
		return v
	}
	text := func(sel string) string {
		t.Helper()
		// textContent: SVG elements have no innerText.
		v, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(document.querySelector(`+strconv.Quote(sel)+`) || {}).textContent || ""`))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return v
	}
	shot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		path := filepath.Join(dir, name+".png")
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", path)
	}
	want := func(sel string, atLeast int) {
		t.Helper()
		if got := count(sel); got < atLeast {
			t.Errorf("%s: %d elements, want at least %d", sel, got, atLeast)
		}
	}

	// The instances page: ready, and both charts with their axes.
	want(`#ready-state[data-ready="true"]`, 1)
	want(`#per-minute .y-axis .tick-label`, 2)
	want(`#per-minute .x-axis .tick-label`, 2)
	want(`#per-minute .axis-title`, 2)
	want(`#lag-y-seconds .tick-label`, 2)
	want(`#lag-y-bytes .tick-label`, 2)
	want(`#replication .x-axis .tick-label`, 2)
	if got := text(`#lag-y-seconds .tick-label`); got != "0 s" {
		t.Errorf("the lag chart's first seconds tick is %q, want 0 s", got)
	}
	shot("page-instances-1400x900")

	// The dead letters page.
	if err := chromedp.Do(ctx, chromedp.Click(css("#nav-deadletters")), chromedp.WaitVisible(css("#dead-letter-list"))); err != nil {
		t.Fatalf("browser: open the dead letters page: %v", err)
	}
	want(`#dead-letter-list tr.dead-letter-row`, 4)
	want(`#dead-letter-list td[data-field="age"]`, 4)
	want(`table.parked-list[data-sink="hook"] tr.parked-row`, 4)
	want(`#outcome-counts tr[data-outcome]`, 5)
	want(`#ready-state[data-ready="true"]`, 1)
	if got := text(`#outcome-counts tr[data-outcome="reply"] td[data-field="count"]`); got != "3311" {
		t.Errorf("reply outcome count %q, want 3311", got)
	}
	if got := count(`button[data-action="skip"]:disabled`); got != 0 {
		t.Errorf("%d skip buttons disabled for an operate token", got)
	}
	shot("page-deadletters-1400x900")

	// Skip one parked event through the confirm dialog.
	if err := chromedp.Do(ctx, chromedp.Click(css(`button[data-action="skip"][data-id="ev-b1"]`)), chromedp.WaitVisible(css("#confirm-reason")),
		chromedp.SendKeys(css("#confirm-reason"), "the receiver dropped this order type"), chromedp.Click(css("#confirm-yes")),
		chromedp.WaitVisible(css(`tr.skipped[data-id="ev-b1"]`))); err != nil {
		t.Fatalf("browser: skip a parked event: %v", err)
	}
	if n := sc.count(t, `SELECT count(*) FROM relay_sink_skipped WHERE event_id = 'ev-b1'`); n != 1 {
		t.Errorf("%d rows in relay_sink_skipped for the skipped event, want 1", n)
	}

	// The relay stalls: the top of the page says so, with the reason.
	stalled.Store(true)
	if err := chromedp.Do(ctx, chromedp.Navigate(b.ts.URL+"/deadletters"), chromedp.WaitVisible(css(`#ready-state[data-ready="false"]`))); err != nil {
		t.Fatalf("browser: the stalled state: %v", err)
	}
	if got := text(`#ready-reasons li`); got != "stream: stalled for 2m10s: sink hook refuses the batch (POST answered 503)" {
		t.Errorf("not-ready reason %q", got)
	}
	shot("page-deadletters-stalled-1400x900")

	// The other pages open at this size too.
	for _, p := range []struct{ path, sel, name string }{
		{"/definitions", "#nav-definitions", "page-definitions-1400x900"},
		{"/sagas/" + id.String(), "#journal", "page-saga-1400x900"},
	} {
		if err := chromedp.Do(ctx, chromedp.Navigate(b.ts.URL+p.path), chromedp.WaitVisible(css(p.sel))); err != nil {
			t.Fatalf("browser: open %s: %v", p.path, err)
		}
		shot(p.name)
	}
}

// browserAt starts a headless Chromium with a window of w×h on url and
// returns a context bounded by timeout for the steps that follow.
func browserAt(t *testing.T, url string, w, h int, timeout time.Duration) context.Context {
	t.Helper()
	chromium := requireChromium(t)
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(w, h),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	bctx, cancelBrowser := chromedp.NewContext(allocCtx)
	t.Cleanup(cancelBrowser)
	if err := chromedp.Do(bctx, chromedp.Navigate(url)); err != nil {
		t.Fatalf("browser: open the page: %v", err)
	}
	tctx, cancel := context.WithTimeout(bctx, timeout)
	t.Cleanup(cancel)
	return tctx
}
