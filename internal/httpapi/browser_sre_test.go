package httpapi_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/correlator"
	"github.com/compensa/compensa/internal/httpapi"
	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/pgjournal"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/sagamix"
	"github.com/compensa/compensa/test/testkit"
)

// lagIdle is how long TestBrowserListTimelineAndIdleLag watches an idle
// relay's lag chart: 15 s, or the full minute with RELAY_TEST_HEAVY=1 (make
// test-lag-idle).
var lagIdle = func() time.Duration {
	if testkit.Heavy() {
		return time.Minute
	}
	return 15 * time.Second
}()

// artefactDir is where browser tests leave their screenshots: $ARTIFACTS_DIR,
// or compensa-artifacts in the system's temporary directory (never the
// repository).
func artefactDir(t *testing.T) string {
	dir := os.Getenv("ARTIFACTS_DIR")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "compensa-artifacts")
	}
	dir = filepath.Join(dir, t.Name())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestBrowserListTimelineAndIdleLag looks at the monitor as an SRE does, in
// a real headless Chromium, over a real relay stream (cdc + correlator) and
// a mixed set of instances written through the real journal: the list's
// ids, steps and reasons; a compensated instance's timeline; and the
// replication chart of an idle relay, flat at 0 s across many heartbeats.
// Screenshots of the three go to artefactDir.
func TestBrowserListTimelineAndIdleLag(t *testing.T) {
	chromium := requireChromium(t)
	db := pgtest.NewDB(t)
	ctx := context.Background()
	reg := saga.NewRegistry()
	reg.MustRegister(sagamix.Definition())
	journal, err := pgjournal.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}

	// The relay's stream and correlator, heartbeating every second.
	corr, err := correlator.New(db.Pool, &correlator.Config{Registry: saga.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := cdc.NewStream(cdc.Config{DatabaseURL: db.URL, Slot: db.Slot, Publication: db.Publication,
		HeartbeatInterval: time.Second, StatusInterval: 200 * time.Millisecond, LeaderPollInterval: 200 * time.Millisecond}, corr)
	if err != nil {
		t.Fatal(err)
	}
	sctx, stopStream := context.WithCancel(ctx)
	streamDone := make(chan error, 1)
	go func() { streamDone <- stream.Run(sctx) }()
	t.Cleanup(func() {
		stopStream()
		if err := <-streamDone; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("stream: %v", err)
		}
	})

	replication := func(ctx context.Context) (httpapi.ReplicationStatus, error) {
		r, err := cdc.QueryLag(ctx, db.Pool, db.Slot)
		if errors.Is(err, cdc.ErrSlotNotFound) {
			return httpapi.ReplicationStatus{Slot: db.Slot}, nil
		}
		if err != nil {
			return httpapi.ReplicationStatus{}, err
		}
		return httpapi.ReplicationStatus{Slot: r.Slot, Exists: true, Active: r.Active, WALStatus: r.WALStatus, LagBytes: r.LagBytes,
			LagSeconds: r.LagSeconds, ConfirmedFlushLSN: r.ConfirmedFlushLSN, CurrentLSN: r.CurrentLSN}, nil
	}
	srv, err := httpapi.New(httpapi.Config{Pool: db.Pool, Journal: journal, Registry: reg, APIToken: token,
		Replication: replication, LagSampleInterval: time.Second, LagSamples: 600})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	defer ts.Close()

	// Some traffic through the stream, handled, then nothing.
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		return outbox.Write(ctx, tx, outbox.Message{EventType: "nobody.listens", Payload: map[string]any{"n": 1}})
	}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := replication(ctx)
		if err == nil && st.LagSeconds != nil && st.Active {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stream never checkpointed: %+v %v", st, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	set := sagamix.Write(t, journal, tenantA)

	rctx, stopRun := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	idleFrom := time.Now()
	go func() { runDone <- srv.Run(rctx) }()
	defer func() { stopRun(); <-runDone }()

	dir := artefactDir(t)
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1400, 1000),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(allocCtx)
	defer cancelBrowser()
	shot := func(ctx context.Context, name string, sel string) {
		t.Helper()
		var png []byte
		var err error
		if sel == "" {
			png, err = chromedp.Run(ctx, chromedp.FullScreenshot(100))
		} else {
			png, err = chromedp.Run(ctx, chromedp.Screenshot(chromedp.CSS(sel)))
		}
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		path := filepath.Join(dir, name+".png")
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", path)
	}
	css := func(sel string) chromedp.CSS { return chromedp.CSS(sel) }
	if err := chromedp.Do(bctx, chromedp.Navigate(ts.URL+"/")); err != nil {
		t.Fatalf("browser: open the page: %v", err)
	}
	tctx, cancelTimeout := context.WithTimeout(bctx, lagIdle+3*time.Minute)
	defer cancelTimeout()
	if err := chromedp.Do(tctx, chromedp.WaitVisible(css("#token")), chromedp.SendKeys(css("#token"), token),
		chromedp.Click(css("#login")), chromedp.WaitVisible(css("#recent"))); err != nil {
		t.Fatalf("browser: sign in: %v", err)
	}

	// The list: ids people can tell apart, how each instance ended, why.
	rowText := func(id string) string {
		t.Helper()
		s, err := chromedp.Run(tctx, chromedp.Text(css(`tr.instance-row[data-id="`+id+`"]`)))
		if err != nil {
			t.Fatalf("row %s: %v", id, err)
		}
		return s
	}
	shown := map[string]bool{}
	for _, id := range set.All() {
		text := rowText(id.String())
		short := id.String()[24:]
		if !strings.Contains(text, short) {
			t.Errorf("row of %s does not show its last 12 characters %s: %q", id, short, text)
		}
		if shown[short] {
			t.Errorf("two rows show %s", short)
		}
		shown[short] = true
		title, err := chromedp.Run(tctx, chromedp.AttributeValue(css(`tr.instance-row[data-id="`+id.String()+`"] a.id`), "title"))
		if err != nil || title.Value != id.String() {
			t.Errorf("the id's link title is %q (%v), want the whole id", title.Value, err)
		}
		href, err := chromedp.Run(tctx, chromedp.AttributeValue(css(`tr.instance-row[data-id="`+id.String()+`"] a.id`), "href"))
		if err != nil || href.Value != "/sagas/"+id.String() {
			t.Errorf("the id's link is %q (%v), want the whole id", href.Value, err)
		}
	}
	for id, want := range map[string][]string{
		set.Completed.String():   {"COMPLETED", "completed 4/4"},
		set.Compensated.String(): {"COMPENSATED", "compensated after score_brief", "step score_brief failed permanently"},
		set.Failed.String():      {"FAILED", "compensation of reserve failed", "warehouse down"},
		set.Waiting.String():     {"RUNNING", "charge · waiting for a reply"},
		set.Running.String():     {"RUNNING", "charge", "payment gateway timeout"},
	} {
		text := rowText(id)
		for _, w := range want {
			if !strings.Contains(text, w) {
				t.Errorf("row %s lacks %q: %q", id, w, text)
			}
		}
		step, err := chromedp.Run(tctx, chromedp.Text(css(`tr.instance-row[data-id="`+id+`"] td[data-field="step"]`)))
		if _, numeric := strconv.Atoi(strings.TrimSpace(step)); err != nil || numeric == nil {
			t.Errorf("row %s shows an engine index as its step: %q (%v)", id, step, err)
		}
	}
	shot(tctx, "list", "")

	// A bulk filter on COMPENSATED offers neither retry nor cancel.
	if err := chromedp.Do(tctx, chromedp.Navigate(ts.URL+"/?status=COMPENSATED"), chromedp.WaitVisible(css("#bulk"))); err != nil {
		t.Fatal(err)
	}
	bulkText, err := chromedp.Run(tctx, chromedp.Text(css("#bulk")))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(bulkText, "1 instances match: 0 a retry can act on, 0 a cancel can") || strings.Contains(bulkText, "Retry all") || strings.Contains(bulkText, "Cancel all") {
		t.Errorf("bulk offer for COMPENSATED: %q", bulkText)
	}

	// The compensated instance's timeline.
	if err := chromedp.Do(tctx, chromedp.Navigate(ts.URL+"/sagas/"+set.Compensated.String()), chromedp.WaitVisible(css("#time-axis svg"))); err != nil {
		t.Fatalf("browser, timeline: %v", err)
	}
	kinds, err := chromedp.Run(tctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("#time-axis rect.bar")).map(r => r.dataset.kind + ":" + r.dataset.step + ":" + r.dataset.ms)`))
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, k := range kinds {
		parts := strings.Split(k, ":")
		count[parts[0]+":"+parts[1]]++
		if ms, err := strconv.Atoi(parts[2]); err != nil || ms < 0 || ms > 10000 {
			t.Errorf("bar %s: %v", k, err)
		}
	}
	for k, n := range map[string]int{"attempt:reserve": 1, "attempt:charge": 1, "attempt:score_brief": 2, "backoff:score_brief": 1,
		"compensation:charge": 1, "compensation:reserve": 1} {
		if count[k] != n {
			t.Errorf("timeline has %d %s bars, want %d (all: %v)", count[k], k, n, kinds)
		}
	}
	journalText, err := chromedp.Run(tctx, chromedp.Text(css("#journal")))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(journalText, ".") || !strings.Contains(journalText, " ms") {
		t.Errorf("the journal shows no milliseconds or durations:\n%s", journalText)
	}
	shot(tctx, "compensated-timeline", "")

	// The waiting instance's timeline shows the wait.
	if err := chromedp.Do(tctx, chromedp.Navigate(ts.URL+"/sagas/"+set.Waiting.String()), chromedp.WaitVisible(css("#time-axis svg"))); err != nil {
		t.Fatalf("browser, waiting timeline: %v", err)
	}
	if n, err := chromedp.Run(tctx, chromedp.Evaluate[int](`document.querySelectorAll('#time-axis rect.bar[data-kind="waiting"]').length`)); err != nil || n != 1 {
		t.Errorf("waiting bars: %d %v", n, err)
	}

	// The idle relay: every sample of the chart at 0 s, the line flat.
	if wait := time.Until(idleFrom.Add(lagIdle)); wait > 0 {
		time.Sleep(wait)
	}
	samples := srv.LagSamples()
	worst := 0.0
	for _, s := range samples {
		if !s.OK {
			t.Errorf("sample at %s not OK", s.At)
		}
		worst = max(worst, s.LagSeconds)
	}
	span := samples[len(samples)-1].At.Sub(samples[0].At)
	t.Logf("idle relay: %d samples over %s, worst lag_seconds %.3f", len(samples), span.Round(time.Second), worst)
	if worst >= 1 || span < lagIdle-3*time.Second {
		t.Errorf("idle relay: worst lag_seconds %.3f over %s, want < 1 s over %s", worst, span, lagIdle)
	}
	if err := chromedp.Do(tctx, chromedp.Navigate(ts.URL+"/"), chromedp.WaitVisible(css("#replication svg"))); err != nil {
		t.Fatal(err)
	}
	pointsAttr, err := chromedp.Run(tctx, chromedp.AttributeValue(css("#replication polyline.seconds"), "points"))
	if err != nil {
		t.Fatal(err)
	}
	points := pointsAttr.Value
	// The seconds axis' first tick, labelled 0 s, is the line's baseline.
	zeroAttr, err := chromedp.Run(tctx, chromedp.AttributeValue(css("#lag-y-seconds line"), "y1"))
	if err != nil {
		t.Fatal(err)
	}
	zero, err := strconv.ParseFloat(zeroAttr.Value, 64)
	if err != nil {
		t.Fatalf("the 0 s tick's y %q: %v", zeroAttr.Value, err)
	}
	for _, p := range strings.Fields(points) {
		if _, y, _ := strings.Cut(p, ","); y != strconv.FormatFloat(zero, 'f', 1, 64) {
			t.Errorf("the seconds line leaves 0 s at %s (points %s)", p, points)
			break
		}
	}
	shot(tctx, "replication-idle", "#replication")
}
