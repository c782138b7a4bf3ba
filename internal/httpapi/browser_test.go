package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"

	"github.com/compensa/compensa/internal/httpapi"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/pgjournal"
	"github.com/compensa/compensa/test/testkit"
)

// requireChromium returns Debian's chromium, or skips t: in the quick tier
// (-short), and where there is none (`make test` installs it).
func requireChromium(t *testing.T) string {
	t.Helper()
	testkit.SkipShort(t, "a browser test, which needs Chromium")
	p := chromiumPath()
	if p == "" {
		t.Skip("browser test skipped: no chromium binary (/usr/bin/chromium); install Debian's chromium package (make test does)")
	}
	return p
}

// chromiumPath finds Debian's chromium. The browser test skips only when
// there is none: `make test` installs it.
func chromiumPath() string {
	for _, p := range []string{"/usr/bin/chromium", "/usr/bin/chromium-browser"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	return ""
}

// TestBrowserRetry drives the page in a real headless Chromium: sign in
// with the token, find the FAILED instance among the stuck ones, retry it
// through the confirm dialog, see the result, and find retry_requested in
// its journal with the instance back to COMPENSATING.
//
// Set COMPENSA_SCREENSHOTS=dir to keep screenshots of the pages.
func TestBrowserRetry(t *testing.T) {
	chromium := requireChromium(t)
	b := setup(t, options{token: token})
	journal, err := pgjournal.New(b.db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := httpapi.New(httpapi.Config{Pool: b.db.Pool, Journal: journal, Registry: b.reg, APIToken: token,
		Replication: func(context.Context) (httpapi.ReplicationStatus, error) {
			return httpapi.ReplicationStatus{Slot: "relay_outbox", Exists: true, Active: true, WALStatus: "reserved", LagBytes: 2048, LagSeconds: ptr(0.4)}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	defer ts.Close()

	ctx := context.Background()
	id := failedInstance(t, b, journal)

	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium),
		chromedp.Headless,
		chromedp.NoSandbox, // we run as root in CI
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 1000),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(allocCtx)
	defer cancelBrowser()

	shot := func(ctx context.Context, name string) {
		dir := os.Getenv("COMPENSA_SCREENSHOTS")
		if dir == "" {
			return
		}
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err == nil {
			err = os.WriteFile(dir+"/"+name+".png", png, 0o644)
		}
		if err != nil {
			t.Logf("screenshot %s: %v", name, err)
		}
	}
	css := func(sel string) chromedp.CSS { return chromedp.CSS(sel) }

	// The first action starts the browser: chromedp wants it without a
	// timeout (a timeout there would bound the browser's life); every later
	// step runs under one.
	if err := chromedp.Do(bctx, chromedp.Navigate(ts.URL+"/")); err != nil {
		t.Fatalf("browser: open the page: %v", err)
	}
	tctx, cancelTimeout := context.WithTimeout(bctx, 90*time.Second)
	defer cancelTimeout()

	// No session: the page asks for the token.
	if err := chromedp.Do(tctx, chromedp.WaitVisible(css("#token"))); err != nil {
		t.Fatalf("browser: no login form: %v", err)
	}
	loginURL, err := chromedp.Run(tctx, chromedp.Location())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(loginURL, "/login") {
		t.Errorf("without a session the page went to %s, want /login", loginURL)
	}
	row := `tr.stuck-row[data-id="` + id.String() + `"]`
	err = chromedp.Do(tctx,
		chromedp.SendKeys(css("#token"), token),
		chromedp.Click(css("#login")),
		chromedp.WaitVisible(css(row)),
	)
	if err != nil {
		t.Fatalf("browser: sign in and find the stuck instance: %v", err)
	}
	stuckText, err := chromedp.Run(tctx, chromedp.Text(css(row)))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stuckText, "FAILED") || !strings.Contains(stuckText, "failed") || !strings.Contains(stuckText, "warehouse down") {
		t.Errorf("stuck row does not show status, reason and error: %q", stuckText)
	}
	shot(tctx, "1-stuck")

	err = chromedp.Do(tctx,
		chromedp.Click(css(row+` button[data-action="retry"]`)),
		chromedp.WaitVisible(css("#confirm-reason")),
		chromedp.SendKeys(css("#confirm-reason"), "warehouse API is back"),
	)
	if err != nil {
		t.Fatalf("browser: open the confirm dialog: %v", err)
	}
	shot(tctx, "2-confirm")
	if err := chromedp.Do(tctx, chromedp.Click(css("#confirm-yes"))); err != nil {
		t.Fatalf("browser: confirm: %v", err)
	}
	// The result replaces the "Retrying …" note when the API answers.
	const answered = `(function(){ const r = document.querySelector("#result"); return !!r && !r.hidden && !r.textContent.endsWith("…"); })()`
	if _, err := chromedp.Run(tctx, chromedp.Poll[bool](answered, chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		t.Fatalf("browser: no result shown after the retry: %v", err)
	}
	resultText, err := chromedp.Run(tctx, chromedp.Text(css("#result")))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(resultText, "Retry requested") || !strings.Contains(resultText, "COMPENSATING") {
		t.Errorf("result shown after the retry: %q", resultText)
	}
	shot(tctx, "3-result")

	// The saga's page: status and journal.
	if err := chromedp.Do(tctx, chromedp.Navigate(ts.URL+"/sagas/"+id.String()), chromedp.WaitVisible(css("#journal"))); err != nil {
		t.Fatalf("browser, saga page: %v", err)
	}
	status, err := chromedp.Run(tctx, chromedp.Text(css("#status")))
	if err != nil {
		t.Fatal(err)
	}
	journalText, err := chromedp.Run(tctx, chromedp.Text(css("#journal")))
	if err != nil {
		t.Fatal(err)
	}
	shot(tctx, "4-saga")
	if strings.TrimSpace(status) != "COMPENSATING" {
		t.Errorf("saga page status %q, want COMPENSATING", status)
	}
	if !strings.Contains(journalText, "retry_requested") || !strings.Contains(journalText, "warehouse API is back") || !strings.Contains(journalText, "api-token") {
		t.Errorf("journal on the page lacks the retry, its reason or its caller:\n%s", journalText)
	}

	// And in the database: COMPENSATING at the failed compensation, nothing
	// marked compensated, one retry_requested with the page's reason.
	inst, err := journal.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if inst.Status != saga.StatusCompensating || inst.CurrentStep != 0 || inst.Attempt != 0 {
		t.Errorf("after the page's retry: %s at step %d attempt %d", inst.Status, inst.CurrentStep, inst.Attempt)
	}
	evs, err := journal.Load(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	last := evs[len(evs)-1]
	if last.Kind != saga.EventRetryRequested || last.Reason != "warehouse API is back" {
		t.Errorf("last journal event: %s %q", last.Kind, last.Reason)
	}
}

// failedInstance drives an instance to FAILED through the journal: step 0
// done, its compensation failed, given up.
func failedInstance(t *testing.T, b *testBundle, j saga.Journal) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	inst := saga.Instance{ID: uuid.New(), TenantID: tenantA, SagaName: "order", SagaVersion: 1,
		Status: saga.StatusRunning, TriggerEventID: uuid.New(), Context: json.RawMessage(`{"order":"o-1"}`)}
	if err := j.Enqueue(ctx, inst); err != nil {
		t.Fatal(err)
	}
	c, err := j.ClaimPending(ctx, 1, time.Minute)
	if err != nil || len(c) != 1 {
		t.Fatalf("claim: %v %v", c, err)
	}
	lease := c[0].LeaseID.UUID
	for _, ev := range []saga.Event{
		{Kind: saga.EventStepCompleted, Step: 0, StepName: "reserve", Output: json.RawMessage(`{"hold":"h-1"}`)},
		{Kind: saga.EventCompensationStarted, Step: 0, Reason: "charge refused"},
		{Kind: saga.EventCompensationFailed, Step: 0, StepName: "reserve", Error: "warehouse down"},
	} {
		if _, err := j.Append(ctx, inst.ID, lease, ev); err != nil {
			t.Fatalf("append %s: %v", ev.Kind, err)
		}
	}
	if ok, err := j.MarkTerminal(ctx, inst.ID, lease, saga.StatusFailed, "warehouse down"); !ok || err != nil {
		t.Fatalf("MarkTerminal: %v %v", ok, err)
	}
	return inst.ID
}
