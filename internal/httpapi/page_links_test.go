package httpapi

import (
	"bytes"
	"context"
	"html"
	"net/url"
	"regexp"
	"testing"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/admin"
)

// The links the page builds keep their query: "Older →" carries the filter
// and the cursor, an overview count its saga, version and status, each
// value query-escaped (a saga name is any text).
func TestPageLinksKeepTheirQuery(t *testing.T) {
	t.Parallel()
	filter := url.Values{"saga": {"order & co"}, "status": {"FAILED"}, "cursor": {"abc/def+1"}}
	data := indexData{
		Recent:      []admin.Item{{ID: uuid.New(), SagaName: "order & co", SagaVersion: 2, Status: saga.StatusFailed}},
		NextCursor:  "abc/def+1",
		FilterQuery: filter.Encode(),
		Overview:    &admin.Overview{Sagas: []admin.SagaCounts{{Saga: "order & co", Version: 2, ByStatus: map[string]int64{"FAILED": 1}, Total: 1}}},
	}
	var buf bytes.Buffer
	if err := indexView(data).Render(context.Background(), &buf); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	query := func(re string) url.Values {
		t.Helper()
		m := regexp.MustCompile(re).FindStringSubmatch(page)
		if m == nil {
			t.Fatalf("no link matching %s on the page:\n%s", re, page)
		}
		u, err := url.Parse(html.UnescapeString(m[1]))
		if err != nil {
			t.Fatal(err)
		}
		return u.Query()
	}
	if got := query(`<a href="([^"]*)" id="older">`); got.Encode() != filter.Encode() {
		t.Errorf("Older → links to the query %q, want %q", got.Encode(), filter.Encode())
	}
	want := url.Values{"saga": {"order & co"}, "version": {"2"}, "status": {"FAILED"}}
	if got := query(`<td><a href="(/\?saga=[^"]*)">1</a></td>`); got.Encode() != want.Encode() {
		t.Errorf("the overview's FAILED count links to the query %q, want %q", got.Encode(), want.Encode())
	}
}
