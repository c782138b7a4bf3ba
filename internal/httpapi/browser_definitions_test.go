package httpapi_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/compensa/compensa/internal/httpapi"
)

// TestBrowserDefinitionsPicture opens the definitions page in a real
// headless Chromium, under the page's CSP, and checks that the picture is
// drawn as meant: the example saga's steps left to right, each compensation
// below its step, the compensation arrow pointing left, and the stylesheet
// applied (a box without it would be filled black).
//
// Set COMPENSA_SCREENSHOTS=dir to keep a screenshot of the page.
func TestBrowserDefinitionsPicture(t *testing.T) {
	chromium := requireChromium(t)
	declared := declaredDefinitions(t)
	b := setup(t, options{configure: func(c *httpapi.Config) {
		c.Definitions = func() []httpapi.Definition { return declared }
	}})

	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium),
		chromedp.Headless,
		chromedp.NoSandbox, // we run as root in CI
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1200, 900),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(allocCtx)
	defer cancelBrowser()
	// The first action starts the browser, without a timeout (see
	// TestBrowserRetry); the rest run under one.
	if err := chromedp.Do(bctx, chromedp.Navigate(b.ts.URL+"/")); err != nil {
		t.Fatalf("browser: open the page: %v", err)
	}
	tctx, cancel := context.WithTimeout(bctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(tctx, chromedp.Click(chromedp.CSS("#nav-definitions")), chromedp.WaitVisible(chromedp.CSS(".steps-picture svg"))); err != nil {
		t.Fatalf("browser: follow the navigation to the definitions page: %v", err)
	}
	if dir := os.Getenv("COMPENSA_SCREENSHOTS"); dir != "" {
		if png, err := chromedp.Run(tctx, chromedp.FullScreenshot(100)); err == nil {
			_ = os.WriteFile(filepath.Join(dir, "definitions.png"), png, 0o644)
		}
	}

	type box struct {
		Step, Kind               string
		Left, Top, Right, Bottom float64
		Fill                     string
	}
	const measure = `(function(sel){ return [...document.querySelectorAll(sel)].map(g => { const r = g.querySelector("rect").getBoundingClientRect();
		return {Step: g.dataset.step, Kind: g.dataset.kind, Left: r.left, Top: r.top, Right: r.right, Bottom: r.bottom, Fill: getComputedStyle(g.querySelector("rect")).fill}; }); })`
	steps, err := chromedp.Run(tctx, chromedp.Evaluate[[]box](measure+`(".step-box")`))
	if err != nil {
		t.Fatal(err)
	}
	comps, err := chromedp.Run(tctx, chromedp.Evaluate[[]box](measure+`(".comp-box")`))
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != 4 || len(comps) != 2 {
		t.Fatalf("drawn %d steps and %d compensations, want 4 and 2: %+v %+v", len(steps), len(comps), steps, comps)
	}
	for i, want := range []string{"reserve_stock", "charge_payment", "ship", "confirm"} {
		s := steps[i]
		if s.Step != want || s.Right <= s.Left || s.Bottom <= s.Top {
			t.Errorf("step %d drawn as %+v, want %s with a size", i, s, want)
		}
		if i > 0 && s.Left <= steps[i-1].Right {
			t.Errorf("step %s is not to the right of %s", s.Step, steps[i-1].Step)
		}
		if s.Fill == "" || s.Fill == "rgb(0, 0, 0)" {
			t.Errorf("step box fill %q: the stylesheet is not applied", s.Fill)
		}
	}
	for i, c := range comps {
		s := steps[i]
		if c.Step != s.Step || c.Top <= s.Bottom || c.Left != s.Left {
			t.Errorf("compensation %+v is not right below its step %+v", c, s)
		}
	}
	// The arrow between the compensations points left: its head is at the
	// line's left end.
	head, err := chromedp.Run(tctx, chromedp.Evaluate[[]float64](`(function(){ const l = document.querySelector("line.back").getBoundingClientRect(), h = document.querySelector("polygon.back-head").getBoundingClientRect(); return [l.left, l.right, h.left, h.right]; })()`))
	if err != nil {
		t.Fatal(err)
	}
	if len(head) != 4 || head[2] > head[0]+1 || head[3] > head[0]+10 || head[1] < comps[1].Left-1 {
		t.Errorf("compensation arrow line %v..%v, head %v..%v: want it to point left from charge_payment's compensation", head[0], head[1], head[2], head[3])
	}
}
