package check

import (
	"log/slog"
	"regexp"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

// TestAlertRulesParse runs the rule file through rulefmt.ParseFile (unknown
// fields are errors, every expression and template is parsed) and requires
// each alert to carry a severity, a summary and a runbook link.
func TestAlertRulesParse(t *testing.T) {
	p := parser.NewParser(parser.Options{})
	groups, errs := rulefmt.ParseFile("../prometheus/alerts.yml", false, model.UTF8Validation, p, slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Error(err)
	}
	if groups == nil {
		t.Fatal("no rule groups")
	}
	anchor := regexp.MustCompile(`^docs/runbook\.md#[a-z0-9-]+$`)
	n := 0
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			if _, err := p.ParseExpr(r.Expr); err != nil {
				t.Errorf("%s: %v", r.Alert, err)
			}
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || !anchor.MatchString(r.Annotations["runbook_url"]) {
				t.Errorf("%s: needs labels.severity, annotations.summary and a runbook_url docs/runbook.md#anchor", r.Alert)
			}
		}
	}
	if n < 7 {
		t.Errorf("%d alerts, want at least 7", n)
	}
}

// TestRuleParserRejectsNonsense: the check can fail.
func TestRuleParserRejectsNonsense(t *testing.T) {
	p := parser.NewParser(parser.Options{})
	_, errs := rulefmt.Parse([]byte("groups:\n  - name: x\n    rules:\n      - alert: A\n        expr: sum by (x (y)\n"), false, model.UTF8Validation, p, slog.New(slog.DiscardHandler))
	if len(errs) == 0 {
		t.Fatal("a broken expression parsed")
	}
}
