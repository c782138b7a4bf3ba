package admin_test

import (
	"context"
	"strings"
	"testing"

	"github.com/compensa/compensa/saga"
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
