package admin_test

import (
	"context"
	"strings"
	"testing"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/admin"
)

func TestOverviewSmoke(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, row{tenant: tenantA, saga: "order", version: 1, status: saga.StatusFailed, lastError: "refund 12 refused for 3f0c2a9e-5b1d-4c6e-8f7a-9b0c1d2e3f40"})
	o, err := b.adm.Overview(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(o.PerMinute) != 60 || len(o.Sagas) != 1 || len(o.TopErrors) != 1 || !strings.Contains(o.TopErrors[0].Message, "refund <n> refused for <id>") {
		t.Fatalf("%+v", o)
	}
}

func TestNormaliseError(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"refund 12 refused for 3f0c2a9e-5b1d-4c6e-8f7a-9b0c1d2e3f40 after 3s": "refund <n> refused for <id> after <n>s",
		"no digits here":                       "no digits here",
		"3F0C2A9E-5B1D-4C6E-8F7A-9B0C1D2E3F40": "<id>",
		"3f0c2a9e-5b1d-4c6e-8f7a-9b0c1d2e3f4":  "<n>f<n>c<n>a<n>e-<n>b<n>d-<n>c<n>e-<n>f<n>a-<n>b<n>c<n>d<n>e<n>f<n>",
		"":                                     "",
	} {
		if got := admin.NormaliseError(in); got != want {
			t.Errorf("NormaliseError(%q) = %q, want %q", in, got, want)
		}
	}
}
