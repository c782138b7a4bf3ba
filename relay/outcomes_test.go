package relay_test

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

// The dead letters page counts what became of every event this relay's
// correlator streamed: started, filtered, ignored and parked, as the events
// written below make them.
func TestDeadLettersPageCountsOutcomes(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	dir := t.TempDir()
	writeSaga(t, dir, "orders.yaml", `saga: orders
version: 1
triggers:
  - event_type: order.placed
    filter: "${ trigger.payload.cents >= 100 }"
    schema:
      type: object
      properties: {cents: {type: integer}}
      required: [cents]
steps:
  - name: note
    sql: {query: "SELECT 1"}
`)
	r := flowRelay(t, db, dir)
	t.Cleanup(func() { r.Stop(context.Background()) })

	writeTrigger(t, db, "order.placed", "started", `{"cents": 250}`)
	writeTrigger(t, db, "order.placed", "filtered", `{"cents": 5}`)
	writeTrigger(t, db, "order.placed", "parked", `{"cents": "many"}`)
	writeTrigger(t, db, "order.shipped", "ignored", `{}`)

	want := map[string]string{"started": "1", "filtered": "1", "parked": "1", "ignored": "1"}
	cell := regexp.MustCompile(`(?s)data-outcome="(\w+)".*?data-field="count"[^>]*>\s*(\d+)\s*<`)
	var got map[string]string
	testkit.WaitFor(t, 30*time.Second, "the page to count every outcome", func() bool {
		resp, err := http.Get("http://" + r.Addr() + "/deadletters")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /deadletters: %d\n%s", resp.StatusCode, body)
		}
		got = map[string]string{}
		for _, m := range cell.FindAllStringSubmatch(string(body), -1) {
			got[m[1]] = m[2]
		}
		for k, v := range want {
			if got[k] != v {
				return false
			}
		}
		return true
	})
	if got["reply"] != "0" {
		t.Errorf("reply outcomes %q, want 0 (no saga waits for a reply)", got["reply"])
	}
}
