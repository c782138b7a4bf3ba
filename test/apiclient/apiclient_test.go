// Package apiclient_test runs a Go client generated from the relay's
// OpenAPI description (package client, by oapi-codegen) against a running
// relay. It is a module of its own so that oapi-codegen and its runtime stay
// out of the relay's go.mod; `make test` runs it (`make apiclient-check`).
package apiclient_test

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/compensa/compensa/test/apiclient/client"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

func TestMain(m *testing.M) {
	testkit.SkipSuiteInShort("a generated client against the relay binary")
	code := pgtest.Main(m)
	relaytest.Cleanup()
	os.Exit(code)
}

const token = "0f3c9a7e5b1d4c6e8f7a9b0c1d2e3f40a1b2c3d4e5f60718"

// TestGeneratedClientCallsARunningRelay starts a relay on a fresh database,
// commits a research brief and its outbox row as a producer does, and
// follows the saga through the generated client: GET /v1/sagas until it is
// COMPLETED, GET /v1/sagas/{id}, GET /v1/overview, GET /v1/definitions, and
// an unauthenticated call answered 401 with the Error schema.
func TestGeneratedClientCallsARunningRelay(t *testing.T) {
	db := pgtest.NewDB(t)
	p := relaytest.Start(t, nil, "--database-url", db.URL, "--slot", db.Slot, "--publication", db.Publication,
		"--status-interval", "200ms", "--heartbeat-interval", "1s", "--api-token", token)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	bearer := func(_ context.Context, req *http.Request) error {
		req.Header.Set("Authorization", "Bearer "+token)
		return nil
	}
	c, err := client.NewClientWithResponses("http://"+p.Addr, client.WithRequestEditorFn(bearer))
	if err != nil {
		t.Fatal(err)
	}

	if _, err := db.Pool.Exec(ctx, `
WITH brief AS (
  INSERT INTO research_briefs (tenant_id, title, body)
  VALUES ('d3e0d3e0-0000-4000-8000-00000000de70', 'Saving coral reefs', 'Can coral nurseries keep up with coral bleaching?')
  RETURNING id, tenant_id)
INSERT INTO outbox (tenant_id, aggregate_type, aggregate_id, event_type, payload)
SELECT tenant_id, 'research_brief', id::text, 'research_brief.created', jsonb_build_object('brief_id', id)
FROM brief`); err != nil {
		t.Fatal(err)
	}

	var item client.Item
	for {
		status := client.ListSagasParamsStatusCOMPLETED
		res, err := c.ListSagasWithResponse(ctx, &client.ListSagasParams{Status: &status})
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode() != http.StatusOK || res.JSON200 == nil {
			t.Fatalf("GET /v1/sagas: %d %s", res.StatusCode(), res.Body)
		}
		if len(res.JSON200.Items) == 1 {
			item = res.JSON200.Items[0]
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no COMPLETED saga in time\n%s", p.Output())
		case <-time.After(100 * time.Millisecond):
		}
	}
	if item.SagaName != "brief_enrichment" || item.Status != client.ItemStatusCOMPLETED {
		t.Errorf("the listed instance: %+v", item)
	}

	detail, err := c.GetSagaWithResponse(ctx, item.Id, nil)
	if err != nil {
		t.Fatal(err)
	}
	if detail.JSON200 == nil || detail.JSON200.Instance.Id != item.Id || detail.JSON200.Steps == nil || len(*detail.JSON200.Steps) != 4 {
		t.Fatalf("GET /v1/sagas/%s: %d %s", item.Id, detail.StatusCode(), detail.Body)
	}

	overview, err := c.GetOverviewWithResponse(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if overview.JSON200 == nil || len(overview.JSON200.Sagas) == 0 {
		t.Fatalf("GET /v1/overview: %d %s", overview.StatusCode(), overview.Body)
	}

	defs, err := c.ListDefinitionsWithResponse(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if defs.JSON200 == nil {
		t.Fatalf("GET /v1/definitions: %d %s", defs.StatusCode(), defs.Body)
	}

	anonymous, err := client.NewClientWithResponses("http://" + p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	denied, err := anonymous.ListSagasWithResponse(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if denied.StatusCode() != http.StatusUnauthorized || denied.JSON401 == nil || denied.JSON401.Error == "" {
		t.Fatalf("GET /v1/sagas without a token: %d %s", denied.StatusCode(), denied.Body)
	}
}

// TestGeneratedClientIsCurrent: client.gen.go is what oapi-codegen (the
// version go.mod pins as a tool) writes from openapi.json today.
func TestGeneratedClientIsCurrent(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "client.gen.go")
	config, err := os.ReadFile("client/config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	config = bytes.Replace(config, []byte("output: client.gen.go"), []byte("output: "+out), 1)
	if err := os.WriteFile(filepath.Join(dir, "config.yaml"), config, 0o644); err != nil {
		t.Fatal(err)
	}
	spec, err := filepath.Abs("../../internal/httpapi/openapi/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "tool", "oapi-codegen", "-config", filepath.Join(dir, "config.yaml"), spec)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("oapi-codegen: %v\n%s", err, b)
	}
	want, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	have, err := os.ReadFile("client/client.gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(have, want) {
		t.Fatal("client/client.gen.go differs from what oapi-codegen writes from openapi.json: run go generate ./... in test/apiclient")
	}
}
