package sinks

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/compensa/compensa/test/testkit"
)

// TestRedirectingEndpointParksTheEvent: the configured endpoint answers 307
// to another host. The relay never follows it: nothing reaches the second
// host, and the event is parked with "redirected to <host>".
func TestRedirectingEndpointParksTheEvent(t *testing.T) {
	t.Parallel()
	var reached atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer other.Close()
	b := setup(t, 2*time.Second)
	// Before any event is written, so that no request is in flight.
	b.ep.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/collect", http.StatusTemporaryRedirect)
	})
	ids, _ := write(t, b.db, 0, 1, 1)
	testkit.WaitFor(t, 30*time.Second, "the redirected event to be parked", func() bool { return parkedIDs(t, b.db)[ids[0]] })
	var reason string
	if err := b.db.Pool.QueryRow(context.Background(), `SELECT reason FROM relay_sink_parked WHERE event_id = $1`, ids[0]).Scan(&reason); err != nil {
		t.Fatal(err)
	}
	if host := other.Listener.Addr().String(); !strings.Contains(reason, "redirected to "+host) {
		t.Errorf("parked with %q, want \"redirected to %s\"", reason, host)
	}
	if n := reached.Load(); n != 0 {
		t.Errorf("the host the redirect named got %d requests", n)
	}
}
