package httpapi_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/compensa/compensa/test/testkit"
)

// TestSearchByTheEndOfAnID: the API and the page find an instance by the
// last characters of its id (the 12 the list shows, or 8 or more), and say
// to give more when those characters end several ids.
func TestSearchByTheEndOfAnID(t *testing.T) {
	testkit.SkipShort(t, "searches thousands of instances")
	t.Parallel()
	b := setup(t, options{})
	ids := []uuid.UUID{
		uuid.MustParse("01a231ce-0000-7000-8000-00000000beef"),
		uuid.MustParse("01a231ce-0001-7000-8000-00001111beef"),
		uuid.MustParse("01a231ce-0002-7000-8000-22220000beef"),
	}
	for _, id := range ids {
		if _, err := b.db.Pool.Exec(t.Context(), `INSERT INTO saga_instances (id, tenant_id, saga_name, saga_version, status, trigger_event_id)
			VALUES ($1, $2, 'order', 1, 'RUNNING', gen_random_uuid())`, id, tenantA); err != nil {
			t.Fatal(err)
		}
	}
	r := b.do(t, http.MethodGet, "/v1/search?q=00001111beef", "")
	if r.status != http.StatusOK {
		t.Fatalf("search by 12 characters: %d %s", r.status, r.body)
	}
	items := r.json(t)["items"].([]any)
	if len(items) != 1 || items[0].(map[string]any)["id"] != ids[1].String() || items[0].(map[string]any)["matched_by"] != "instance_id_suffix" {
		t.Fatalf("search by 12 characters: %s", r.body)
	}
	r = b.do(t, http.MethodGet, "/v1/search?q=0000beef", "")
	if msg := r.errorMessage(t); r.status != http.StatusBadRequest || !strings.Contains(msg, "more than one instance") {
		t.Fatalf("an end shared by two ids: %d %q", r.status, msg)
	}
	page := b.do(t, http.MethodGet, "/search?q=22220000beef", "")
	if page.status != http.StatusOK || !strings.Contains(string(page.body), `href="/sagas/`+ids[2].String()+`"`) || !strings.Contains(string(page.body), "22220000beef") {
		t.Fatalf("page search by 8 characters: %d\n%s", page.status, page.body)
	}
	page = b.do(t, http.MethodGet, "/search?q=0000beef", "")
	if page.status != http.StatusOK || !strings.Contains(string(page.body), "is the end of more than one instance id: give more of it") {
		t.Fatalf("page search by an ambiguous end: %d\n%s", page.status, page.body)
	}
}
