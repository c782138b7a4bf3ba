package httpapi_test

import (
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/compensa/compensa/internal/httpapi"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/declare"
)

// declaredDefinitions loads the example's order saga as relay run --sagas
// does and describes it as GET /v1/definitions lists it.
func declaredDefinitions(t *testing.T) []httpapi.Definition {
	t.Helper()
	name := filepath.Join("..", "..", "examples", "orders", "sagas", "order_fulfilment.yaml")
	body, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	s, problems := declare.LoadFile(name, body, declare.Options{})
	if len(problems) > 0 {
		t.Fatalf("example saga: %v", problems)
	}
	d := httpapi.Definition{Name: s.Name, Version: s.Version, Source: s.File, Hash: s.Hash}
	for _, tr := range s.Triggers {
		d.Triggers = append(d.Triggers, httpapi.DefinitionTrigger{EventType: tr.EventType, AggregateType: tr.AggregateType})
	}
	for _, st := range s.Steps {
		d.Steps = append(d.Steps, httpapi.DefinitionStep{Name: st.Name, Kind: st.Kind(), Compensate: st.Compensate.Kind()})
	}
	return []httpapi.Definition{d}
}

// stepsIn returns the data-step attributes of the elements of class class,
// in document order.
func stepsIn(page, class string) []string {
	re := regexp.MustCompile(`<g class="` + class + ` kind-[a-z]*" data-step="([^"]*)" data-kind="([a-z]*)"`)
	var out []string
	for _, m := range re.FindAllStringSubmatch(page, -1) {
		out = append(out, m[1]+":"+m[2])
	}
	return out
}

func TestDefinitionsPage(t *testing.T) {
	t.Parallel()
	declared := declaredDefinitions(t)
	// A Go saga's names are any strings: they must reach the page as text.
	evil := saga.Definition{Name: `<script>alert("saga")</script>`, Version: 3,
		Triggers: []saga.Trigger{{EventType: `<img src=x onerror=alert(1)>`}},
		Steps: []saga.Step{
			{Name: `<b>first</b>`, Do: noop},
			{Name: `second"><svg onload=alert(2)>`, Do: noop, Compensate: noop},
		}}
	var reg *saga.Registry
	b := setup(t, options{configure: func(c *httpapi.Config) {
		reg = c.Registry
		c.Definitions = func() []httpapi.Definition {
			return append(httpapi.RegistryDefinitions(reg), declared...)
		}
	}})
	b.reg.MustRegister(evil)

	r := b.do(t, "GET", "/definitions", "")
	if r.status != http.StatusOK {
		t.Fatalf("GET /definitions: %d %s", r.status, r.body)
	}
	page := string(r.body)
	if csp := r.header.Get("Content-Security-Policy"); !strings.Contains(csp, "style-src 'self'") {
		t.Errorf("Content-Security-Policy %q", csp)
	}
	if strings.Contains(page, "<script>alert") || strings.Contains(page, "<img src=x") ||
		strings.Contains(page, "<b>first") || strings.Contains(page, "<svg onload") {
		t.Error("a name from a definition reached the page as markup")
	}
	for _, want := range []string{`&lt;script&gt;alert(&#34;saga&#34;)&lt;/script&gt;`, `&lt;img src=x onerror=alert(1)&gt;`, `&lt;b&gt;first&lt;/b&gt;`} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks the escaped %s", want)
		}
	}
	if strings.Count(page, `<style`) != 0 || strings.Count(page, ` style=`) != 0 || strings.Count(page, `<script>`) != 0 {
		t.Error("the page has inline styles or scripts, which its CSP refuses")
	}

	// The example: file, hash, trigger, and its steps in order with their
	// compensations, chained right to left.
	declaredAt := strings.Index(page, `data-saga="order_fulfilment"`)
	if declaredAt < 0 {
		t.Fatal("the declared saga is not on the page")
	}
	d := declared[0]
	ex := page[declaredAt:]
	for _, want := range []string{d.Source, d.Hash, "order.placed", "v1"} {
		if !strings.Contains(ex, want) {
			t.Errorf("declared saga's section lacks %q", want)
		}
	}
	if got, want := strings.Join(stepsIn(ex, "step-box"), " "), "reserve_stock:sql charge_payment:http ship:command confirm:sql"; got != want {
		t.Errorf("steps drawn %q, want %q", got, want)
	}
	if got, want := strings.Join(stepsIn(ex, "comp-box"), " "), "reserve_stock:sql charge_payment:http"; got != want {
		t.Errorf("compensations drawn %q, want %q", got, want)
	}
	// charge_payment's compensation runs first, then reserve_stock's.
	order := regexp.MustCompile(`class="comp-box kind-[a-z]*" data-step="([^"]*)" data-kind="[a-z]*" data-order="(\d+)"`).FindAllStringSubmatch(ex, -1)
	if len(order) != 2 || order[0][1]+order[0][2] != "reserve_stock2" || order[1][1]+order[1][2] != "charge_payment1" {
		t.Errorf("compensation order %v, want charge_payment 1, reserve_stock 2", order)
	}
	if n := strings.Count(ex, `class="fwd"`); n != 3 {
		t.Errorf("%d forward arrows between 4 steps, want 3", n)
	}
	if n := strings.Count(ex, `class="back"`); n != 1 {
		t.Errorf("%d backward arrows between 2 compensations, want 1", n)
	}
	if !strings.Contains(ex, "no compensation") {
		t.Error("ship and confirm have no compensation and the picture does not say so")
	}

	// The Go sagas are drawn too, with kind "go".
	goAt := strings.Index(page, `data-saga="order"`)
	if goAt < 0 || goAt > declaredAt {
		t.Fatal("the Go saga \"order\" is not on the page before the declared one")
	}
	if got, want := strings.Join(stepsIn(page[goAt:declaredAt], "step-box"), " "), "reserve:go charge:go ship:go"; got != want {
		t.Errorf("Go saga's steps %q, want %q", got, want)
	}
	evilSteps := stepsIn(page[:goAt], "step-box")
	if len(evilSteps) != 2 || evilSteps[0] != `&lt;b&gt;first&lt;/b&gt;:go` {
		t.Errorf("escaped Go saga's steps %q", evilSteps)
	}
	if !strings.Contains(page, `href="/definitions"`) {
		t.Error("the navigation does not link the definitions page")
	}
}

func TestDefinitionsPageEmptyAndAuth(t *testing.T) {
	t.Parallel()
	b := setup(t, options{token: token, configure: func(c *httpapi.Config) {
		c.Definitions = func() []httpapi.Definition { return nil }
	}})
	if r := b.do(t, "GET", "/definitions", ""); r.status != http.StatusSeeOther || r.header.Get("Location") != "/login?next=%2Fdefinitions" {
		t.Errorf("definitions page without a session: %d %s", r.status, r.header.Get("Location"))
	}
	r := b.do(t, "POST", "/login", url.Values{"token": {token}, "next": {"/definitions"}}.Encode(), "Content-Type", "application/x-www-form-urlencoded")
	if r.status != http.StatusSeeOther || r.header.Get("Location") != "/definitions" {
		t.Fatalf("login: %d %s", r.status, r.header.Get("Location"))
	}
	session := strings.SplitN(r.header.Get("Set-Cookie"), ";", 2)[0]
	r = b.do(t, "GET", "/definitions", "", "Cookie", session)
	if r.status != http.StatusOK || !strings.Contains(string(r.body), `id="no-definitions"`) || strings.Contains(string(r.body), "<svg") {
		t.Errorf("definitions page with nothing loaded: %d, want 200 saying no saga is loaded", r.status)
	}
}
