package relay_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/compensa/compensa/test/pgtest"
)

// Payload text in a declared http step's URL is escaped for where it
// stands: the path-traversal payload arrives at the participant (a real
// HTTP server) as one escaped path segment, the query text as one escaped
// value, and the host and the rest of the path stay the file's.
func TestURLTemplateEscapesPayload(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Method+" "+r.RequestURI+" path="+r.URL.Path+" note="+r.URL.Query().Get("note"))
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
		w.Write([]byte(`{}`))
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	writeSaga(t, dir, "calls.yaml", `saga: calls
version: 1
triggers: [{event_type: call.requested}]
steps:
  - name: call
    http:
      method: POST
      url: "`+srv.URL+`/step/${ trigger.payload.path }?note=${ trigger.payload.note }"
`)
	r := flowRelay(t, db, dir)
	t.Cleanup(func() { r.Stop(context.Background()) })
	writeTrigger(t, db, "call.requested", "evil", `{"path": "../../admin/delete?all=true#x", "note": "a&all=true#y"}`)
	if status, _ := flowStatus(t, db, "evil", 30*time.Second); status != "COMPLETED" {
		t.Fatalf("the call: %s", status)
	}
	mu.Lock()
	defer mu.Unlock()
	want := "POST /step/..%2F..%2Fadmin%2Fdelete%3Fall=true%23x?note=a%26all%3Dtrue%23y path=/step/../../admin/delete?all=true#x note=a&all=true#y"
	if len(got) != 1 || got[0] != want {
		t.Fatalf("the participant received %q\nwant %q", got, want)
	}
}
