package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/compensa/compensa/correlator"
	"github.com/compensa/compensa/internal/httpapi"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/pgjournal"
)

// exported scrapes a monitor whose every metric family has a value and
// returns each exported series name with its label names.
func exported(t *testing.T) map[string]map[string]bool {
	t.Helper()
	b := setup(t, options{token: token, replication: func(context.Context) (httpapi.ReplicationStatus, error) {
		return httpapi.ReplicationStatus{Slot: "relay_outbox", Exists: true, Active: true, WALStatus: "reserved"}, nil
	}})
	j, err := pgjournal.New(b.db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := httpapi.New(httpapi.Config{Pool: b.db.Pool, Journal: j, Registry: b.reg, APIToken: token, Metrics: b.metrics,
		Replication: func(context.Context) (httpapi.ReplicationStatus, error) {
			return httpapi.ReplicationStatus{Slot: "relay_outbox", Exists: true, Active: true, WALStatus: "reserved"}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	b.srv = srv
	b.ts.Config.Handler = srv
	// The correlator registers its own counters beside the monitor's, as
	// the relay does.
	corr, err := correlator.New(b.db.Pool, &correlator.Config{Registry: b.reg})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range corr.Collectors() {
		b.metrics.Registry().MustRegister(c)
	}
	// Give every vector a child: a vector without one is not exported.
	b.metrics.SagasStarted("order", 1)
	b.metrics.SagaEnded("order", "COMPLETED")
	b.metrics.ObserveStep(httpapi.StepObservation{Saga: "order", Step: "reserve", Phase: httpapi.PhaseDo, Outcome: string(saga.OutcomeRetry), Duration: time.Millisecond})
	id := failedInstance(t, b, j)
	if r := b.do(t, "POST", "/v1/sagas/"+id.String()+"/retry", `{"reason":"x"}`, "Authorization", "Bearer "+token); r.status != http.StatusOK {
		t.Fatalf("retry: %d %s", r.status, r.body)
	}
	b.insert(t, tenantA, saga.StatusFailed, 0, 0)

	r := b.do(t, "GET", "/metrics", "")
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(r.body)))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]bool{}
	for name, f := range fams {
		labels := map[string]bool{}
		for _, m := range f.Metric {
			for _, l := range m.Label {
				labels[l.GetName()] = true
			}
		}
		out[name] = labels
		if f.GetType().String() == "HISTOGRAM" {
			for _, s := range []string{"_bucket", "_count", "_sum"} {
				out[name+s] = labels
			}
			out[name+"_bucket"]["le"] = true
		}
	}
	return out
}

var (
	metricRef   = regexp.MustCompile(`\b(compensa_[a-z0-9_]+)(\{([^}]*)\})?`)
	matcherName = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
)

// checkQuery fails when expr uses a compensa_ metric the relay does not
// export, or a label that metric does not have.
func checkQuery(t *testing.T, where, expr string, names map[string]map[string]bool) int {
	t.Helper()
	n := 0
	for _, m := range metricRef.FindAllStringSubmatch(expr, -1) {
		n++
		labels, ok := names[m[1]]
		if !ok {
			t.Errorf("%s: %s is not a metric the relay exports (query %q)", where, m[1], expr)
			continue
		}
		for _, lm := range matcherName.FindAllStringSubmatch(m[3], -1) {
			if !labels[lm[1]] {
				t.Errorf("%s: %s has no label %q (query %q)", where, m[1], lm[1], expr)
			}
		}
	}
	return n
}

// TestDeployFilesUseExportedMetrics: every query of the Grafana dashboard
// and every alert expression names metrics (and labels) the relay really
// exports; every alert has a runbook section. (The rules' syntax is checked
// by Prometheus's own parser: make deploy-check.)
func TestDeployFilesUseExportedMetrics(t *testing.T) {
	t.Parallel()
	names := exported(t)
	var list []string
	for n := range names {
		if strings.HasPrefix(n, "compensa_") {
			list = append(list, n)
		}
	}
	sort.Strings(list)
	t.Logf("exported: %s", strings.Join(list, " "))

	raw, err := os.ReadFile("../../deploy/grafana/compensa.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	refs := 0
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			refs += checkQuery(t, "dashboard panel "+p.Title, q.Expr, names)
			for _, m := range metricRef.FindAllStringSubmatch(q.Expr, -1) {
				used[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m[1], "_bucket"), "_count"), "_sum")] = true
			}
		}
	}
	if refs < len(dash.Panels)-1 {
		t.Errorf("only %d metric references in %d panels", refs, len(dash.Panels))
	}
	for _, n := range list {
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_count"), "_sum")
		if !used[base] {
			t.Errorf("the dashboard shows nothing of %s", n)
		}
	}

	rules, err := os.ReadFile("../../deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	runbook, err := os.ReadFile("../../docs/runbook.md")
	if err != nil {
		t.Fatal(err)
	}
	alerts := regexp.MustCompile(`(?m)^\s+- alert: (\S+)\n\s+expr: (\|\n(?:\s{12}.*\n)+|.*\n)`).FindAllStringSubmatch(string(rules), -1)
	want := []string{"CompensaRelayDown", "CompensaSagasStuck", "CompensaReplicationLagBytes", "CompensaReplicationLagSeconds",
		"CompensaSlotNotActive", "CompensaParkedEventsGrowing", "CompensaStepFailureRatio"}
	got := map[string]bool{}
	for _, a := range alerts {
		got[a[1]] = true
		checkQuery(t, "alert "+a[1], a[2], names)
		if !strings.Contains(string(runbook), "\n## "+a[1]+"\n") {
			t.Errorf("alert %s has no section in docs/runbook.md", a[1])
		}
		if !strings.Contains(string(rules), "docs/runbook.md#"+strings.ToLower(a[1])) {
			t.Errorf("alert %s does not link its runbook section", a[1])
		}
	}
	for _, w := range want {
		if !got[w] {
			t.Errorf("alerts.yml lacks %s", w)
		}
	}
}
