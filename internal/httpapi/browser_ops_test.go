package httpapi_test

import (
	"context"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"

	"github.com/compensa/compensa/internal/httpapi"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/pgjournal"
)

// browser starts a headless Chromium on url and returns a context bounded
// by timeout for the steps that follow.
func browser(t *testing.T, url string, timeout time.Duration) context.Context {
	t.Helper()
	chromium := requireChromium(t)
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1400, 1000),
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

func screenshot(t *testing.T, ctx context.Context, name string) {
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

// TestBrowserOperations drives the page's operations in Chromium: the
// overview (counts and the per-minute chart), a filtered list's "Retry all
// N" with its confirm showing N, and the search box with each kind of id.
func TestBrowserOperations(t *testing.T) {
	requireChromium(t)
	const failedN = 30
	b := setup(t, options{token: token})
	journal, err := pgjournal.New(b.db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := httpapi.New(httpapi.Config{Pool: b.db.Pool, Journal: journal, Registry: b.reg, APIToken: token})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	ctx := context.Background()

	var failed []uuid.UUID
	for range failedN {
		failed = append(failed, failedInstance(t, b, journal))
	}
	// One RUNNING instance findable by each kind of id.
	found := b.insert(t, tenantB, saga.StatusRunning, 1, 0)
	ids := map[string]string{"instance_id": found.String(), "trigger_event_id": uuid.NewString(),
		"correlation_id": uuid.NewString(), "aggregate_id": "order-77", "command_id": uuid.NewString()}
	if _, err := b.db.Pool.Exec(ctx, `UPDATE saga_instances SET trigger_event_id = $2, correlation_id = $3, trigger_aggregate_id = $4 WHERE id = $1`,
		found, ids["trigger_event_id"], ids["correlation_id"], ids["aggregate_id"]); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(ctx, `INSERT INTO saga_events (instance_id, version, kind, step, payload)
		VALUES ($1, 1, 'step_awaiting', 1, jsonb_build_object('correlation_id', $2::text))`, found, ids["command_id"]); err != nil {
		t.Fatal(err)
	}
	// Completed instances in the last hour, for the chart and durations.
	if _, err := b.db.Pool.Exec(ctx, `
		INSERT INTO saga_instances (tenant_id, saga_name, saga_version, status, trigger_event_id, created_at, completed_at)
		SELECT $1, 'order', 1, 'COMPLETED', gen_random_uuid(), now() - g * interval '1 minute' - interval '3 seconds', now() - g * interval '1 minute'
		FROM generate_series(1, 40) g`, tenantA); err != nil {
		t.Fatal(err)
	}

	bctx := browser(t, ts.URL+"/", 120*time.Second)
	css := func(sel string) chromedp.CSS { return chromedp.CSS(sel) }
	if err := chromedp.Do(bctx, chromedp.WaitVisible(css("#token")), chromedp.SendKeys(css("#token"), token),
		chromedp.Click(css("#login")), chromedp.WaitVisible(css("#overview"))); err != nil {
		t.Fatalf("browser: sign in: %v", err)
	}

	// The overview: counts by status, and the chart drawn with its four
	// series over 60 minutes.
	counts, err := chromedp.Run(bctx, chromedp.Text(css(`#by-status tr[data-saga="order"][data-version="1"]`)))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(counts, "30") || !strings.Contains(counts, "40") {
		t.Errorf("overview row for order v1: %q, want 30 FAILED and 40 COMPLETED", counts)
	}
	points, err := chromedp.Run(bctx, chromedp.Evaluate[[]int](`Array.from(document.querySelectorAll("#per-minute svg polyline")).map(p => p.points.numberOfItems)`))
	if err != nil {
		t.Fatal(err)
	}
	if len(points) != 4 || points[0] != 60 || points[1] != 60 {
		t.Errorf("chart polylines: %v, want 4 series of 60 points", points)
	}
	box, err := chromedp.Run(bctx, chromedp.Evaluate[float64](`document.querySelector("#per-minute svg").getBoundingClientRect().width`))
	if err != nil || box < 100 {
		t.Errorf("the chart is not rendered: width %v %v", box, err)
	}
	caption, _ := chromedp.Run(bctx, chromedp.Text(css("#per-minute figcaption")))
	if !strings.Contains(caption, "completed 40") && !strings.Contains(caption, "completed 39") {
		t.Errorf("chart caption %q, want the last hour's 40 (or 39 at a minute boundary) completions", caption)
	}
	screenshot(t, bctx, "ops-1-overview")

	// Bulk retry from a filtered list: the button says N, the confirm says
	// N, and every instance is retried with the page's reason.
	if err := chromedp.Do(bctx, chromedp.Navigate(ts.URL+"/?saga=order&status=FAILED"), chromedp.WaitVisible(css("#bulk-retry"))); err != nil {
		t.Fatalf("browser: filtered list: %v", err)
	}
	label, _ := chromedp.Run(bctx, chromedp.Text(css("#bulk-retry")))
	if strings.TrimSpace(label) != "Retry all 30" {
		t.Errorf("bulk button %q, want \"Retry all 30\"", label)
	}
	if err := chromedp.Do(bctx, chromedp.Click(css("#bulk-retry")), chromedp.WaitVisible(css("#confirm-reason"))); err != nil {
		t.Fatalf("browser: open the bulk confirm: %v", err)
	}
	title, _ := chromedp.Run(bctx, chromedp.Text(css("#confirm-title")))
	if title != "Retry all 30 instances?" {
		t.Errorf("confirm title %q", title)
	}
	screenshot(t, bctx, "ops-2-bulk-confirm")
	// Nothing happens before the confirm.
	var compensating int
	if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM saga_instances WHERE status = 'COMPENSATING'`).Scan(&compensating); err != nil || compensating != 0 {
		t.Fatalf("before the confirm: %d COMPENSATING (%v)", compensating, err)
	}
	if err := chromedp.Do(bctx, chromedp.SendKeys(css("#confirm-reason"), "warehouse is back"), chromedp.Click(css("#confirm-yes"))); err != nil {
		t.Fatal(err)
	}
	const answered = `(function(){ const r = document.querySelector("#result"); return !!r && !r.hidden && !r.textContent.endsWith("…"); })()`
	if _, err := chromedp.Run(bctx, chromedp.Poll[bool](answered, chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		t.Fatalf("browser: no result after the bulk retry: %v", err)
	}
	result, _ := chromedp.Run(bctx, chromedp.Text(css("#result")))
	if !strings.HasPrefix(result, "30 retried, 0 already requested, 0 conflict") {
		t.Errorf("bulk result %q", result)
	}
	screenshot(t, bctx, "ops-3-bulk-result")
	for _, id := range failed {
		evs, err := journal.Load(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		last := evs[len(evs)-1]
		if last.Kind != saga.EventRetryRequested || last.Reason != "warehouse is back" || last.Actor != "api-token" {
			t.Errorf("instance %s: last event %s %q by %q", id, last.Kind, last.Reason, last.Actor)
		}
	}

	// Search by each kind of id through the header's box.
	for kind, q := range ids {
		row := `#search-results tr[data-id="` + found.String() + `"] .matched-by`
		err := chromedp.Do(bctx, chromedp.Navigate(ts.URL+"/"), chromedp.WaitVisible(css("#search-q")),
			chromedp.SendKeys(css("#search-q"), q), chromedp.Click(css("#search-go")), chromedp.WaitVisible(css(row)))
		if err != nil {
			t.Fatalf("browser: search by %s: %v", kind, err)
		}
		by, _ := chromedp.Run(bctx, chromedp.Text(css(row)))
		if by != kind {
			t.Errorf("search by %s %q: found by %q", kind, q, by)
		}
	}
	screenshot(t, bctx, "ops-4-search")
}
