package e2e

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

// egressSecret authorises the calls of the sagas below; it must reach no
// host but the one a call was allowed to.
const egressSecret = "egress-secret-5d1e9b"

// recorder is a service that counts what reaches it.
type recorder struct {
	mu   sync.Mutex
	got  []string // method path authorization
	srv  *httptest.Server
	host string
}

func newRecorder(t *testing.T, h http.HandlerFunc) *recorder {
	r := &recorder{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.got = append(r.got, req.Method+" "+req.URL.Path+" "+req.Header.Get("Authorization"))
		r.mu.Unlock()
		if h != nil {
			h(w, req)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"ok":true}`))
	}))
	t.Cleanup(r.srv.Close)
	r.host = r.srv.Listener.Addr().String()
	return r
}

func (r *recorder) requests() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.got...)
}

// callbackSaga calls the URL its trigger names: the host comes from event
// data. Its file allows only the name localhost, so that a name the policy
// accepts still has its resolved (loopback) address checked.
const callbackSaga = `saga: callback_probe
version: 1
triggers: [{event_type: probe.requested}]
egress: {allow: ["localhost"]}
defaults: {timeout: 3s, retry: {max_attempts: 2, initial: 10ms, max: 20ms}}
steps:
  - name: call_back
    http:
      method: POST
      url: "${ trigger.payload.callback }"
      headers: {Authorization: "${ 'Bearer ' + secrets.PROBE_TOKEN }"}
      body: {n: 1}
`

// allowedSaga is the same call with 127.0.0.1 on its allow list.
const allowedSaga = `saga: callback_allowed
version: 1
triggers: [{event_type: probe.allowed}]
egress: {allow: ["127.0.0.1"]}
defaults: {timeout: 3s, retry: {max_attempts: 2, initial: 10ms, max: 20ms}}
steps:
  - name: call_back
    http:
      method: POST
      url: "${ trigger.payload.callback }"
      headers: {Authorization: "${ 'Bearer ' + secrets.PROBE_TOKEN }"}
`

// redirectSaga calls a host written in the file, which redirects.
const redirectSaga = `saga: redirect_probe
version: 1
triggers: [{event_type: probe.redirect}]
defaults: {timeout: 3s, retry: {max_attempts: 2, initial: 10ms, max: 20ms}}
steps:
  - name: charge
    http:
      method: POST
      url: "http://FIRST/charges/${ trigger.payload.n }"
      headers: {Authorization: "${ 'Bearer ' + secrets.PROBE_TOKEN }"}
      body: {n: 1}
`

// sameOriginSaga follows a redirect within its own host.
const sameOriginSaga = `saga: same_origin_probe
version: 1
triggers: [{event_type: probe.same_origin}]
defaults: {timeout: 3s, retry: {max_attempts: 2, initial: 10ms, max: 20ms}}
steps:
  - name: charge
    http:
      method: POST
      url: "${ 'http://FIRST/moved/' + trigger.payload.n }"
      follow_redirects: same_origin
      headers: {Authorization: "${ 'Bearer ' + secrets.PROBE_TOKEN }"}
      body: {n: 1}
`

// echoSaga calls a careless service that echoes its Authorization in a 400
// answer after a padding the trigger chooses: the secret lands at every
// offset around the 200 characters an error shows of a body.
const echoSaga = `saga: echo_probe
version: 1
triggers: [{event_type: probe.echo}]
defaults: {timeout: 3s, retry: {max_attempts: 1}}
steps:
  - name: echo
    http:
      method: POST
      url: "http://FIRST/echo/${ trigger.payload.pad }"
      headers: {Authorization: "${ secrets.PROBE_TOKEN }"}
`

func emit(t *testing.T, db *pgtest.DB, eventType string, payload map[string]any) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	id := uuid.New()
	if err := outbox.Write(ctx, tx, outbox.Message{ID: id, AggregateType: "probe", AggregateID: id.String(), EventType: eventType, Payload: payload}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return id
}

func endOf(t *testing.T, db *pgtest.DB, event uuid.UUID) (status, lastError string) {
	t.Helper()
	testkit.WaitFor(t, 60*time.Second, "the saga of "+event.String()+" to end", func() bool {
		st := statusOf(t, db, event)
		return st == "COMPLETED" || st == "FAILED" || st == "COMPENSATED"
	})
	if err := db.Pool.QueryRow(context.Background(), `SELECT status::text, coalesce(last_error, '') || ' ' || coalesce(compensation_reason, '') FROM saga_instances WHERE trigger_event_id = $1`, event).Scan(&status, &lastError); err != nil {
		t.Fatal(err)
	}
	return status, lastError
}

// TestDeclaredHTTPEgress: a saga whose URL comes from the trigger cannot be
// pointed at loopback, cloud metadata, a private address, a name that
// resolves to loopback, or a file:// URL: each call fails for good with
// the reason and nothing is sent. An http step never follows a redirect to
// another host (the second host gets nothing, the secret included), and
// follow_redirects: same_origin follows one within the host.
func TestDeclaredHTTPEgress(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	target := newRecorder(t, nil) // what the payloads point at
	second := newRecorder(t, nil) // where the redirect points
	first := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/moved/") {
			http.Redirect(w, r, "/landed"+strings.TrimPrefix(r.URL.Path, "/moved"), http.StatusTemporaryRedirect)
			return
		}
		if pad, ok := strings.CutPrefix(r.URL.Path, "/echo/"); ok {
			n, _ := strconv.Atoi(pad)
			w.WriteHeader(http.StatusBadRequest)
			w.Write([]byte(strings.Repeat("x", n) + r.Header.Get("Authorization") + " was refused"))
			return
		}
		if strings.HasPrefix(r.URL.Path, "/landed/") {
			w.Write([]byte(`{"ok":true}`))
			return
		}
		http.Redirect(w, r, second.srv.URL+"/collect", http.StatusTemporaryRedirect)
	})
	dir := t.TempDir()
	for name, body := range map[string]string{"callback.yaml": callbackSaga, "allowed.yaml": allowedSaga,
		"redirect.yaml": redirectSaga, "same_origin.yaml": sameOriginSaga, "echo.yaml": echoSaga} {
		body = strings.ReplaceAll(body, "FIRST", first.host)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	relaytest.Start(t, []string{"RELAY_SECRET_PROBE_TOKEN=" + egressSecret},
		relayArgs(db, "--sagas", dir, "--http-egress-allow", "payments.internal,billing.internal")...)

	_, port, _ := net.SplitHostPort(target.host)
	refused := []struct{ url, reason string }{
		{"http://127.0.0.1:" + port + "/hook", "address 127.0.0.1 is refused: a loopback address"},
		{"http://[::ffff:127.0.0.1]:" + port + "/hook", "is refused: a loopback address"},
		{"http://169.254.169.254/latest/meta-data/iam/", "address 169.254.169.254 is refused: a cloud metadata address"},
		{"http://[fd00:ec2::254]/latest/", "address fd00:ec2::254 is refused: a cloud metadata address"},
		{"http://10.1.2.3:" + port + "/hook", "address 10.1.2.3 is refused: a private address"},
		{"http://192.168.0.10/hook", "address 192.168.0.10 is refused: a private address"},
		{"http://localhost:" + port + "/hook", "(resolved from localhost) is refused: a loopback address"},
		{"http://payments.example:" + port + "/hook", "host payments.example is not allowed"},
		{"file:///etc/passwd", `scheme "file" is refused`},
		{"gopher://127.0.0.1:" + port + "/", `scheme "gopher" is refused`},
	}
	events := make([]uuid.UUID, len(refused))
	for i, c := range refused {
		events[i] = emit(t, db, "probe.requested", map[string]any{"callback": c.url})
	}
	var echoes []uuid.UUID
	for pad := 170; pad <= 205; pad++ {
		echoes = append(echoes, emit(t, db, "probe.echo", map[string]any{"pad": strconv.Itoa(pad)}))
	}
	allowed := emit(t, db, "probe.allowed", map[string]any{"callback": "http://" + target.host + "/allowed"})
	redirected := emit(t, db, "probe.redirect", map[string]any{"n": "7"})
	sameOrigin := emit(t, db, "probe.same_origin", map[string]any{"n": "8"})

	for i, c := range refused {
		st, reason := endOf(t, db, events[i])
		if st == "COMPLETED" || !strings.Contains(reason, c.reason) {
			t.Errorf("callback %s: %s %q, want a failure with %q", c.url, st, reason, c.reason)
		}
		if strings.Contains(reason, egressSecret) {
			t.Errorf("callback %s: the reason shows the secret", c.url)
		}
	}
	// Secrets are masked before the body is cut: no part of the secret
	// shows, wherever it falls.
	for i, ev := range echoes {
		st, reason := endOf(t, db, ev)
		if st == "COMPLETED" || !strings.Contains(reason, "answered 400") {
			t.Errorf("echo at offset %d: %s %q", 170+i, st, reason)
		}
		for n := 4; n <= len(egressSecret); n++ {
			if strings.Contains(reason, egressSecret[:n]) {
				t.Errorf("echo at offset %d: last_error shows %q of the secret: %q", 170+i, egressSecret[:n], reason)
				break
			}
		}
	}
	if st, reason := endOf(t, db, allowed); st != "COMPLETED" {
		t.Errorf("a call to an allowed host: %s %q", st, reason)
	}
	if got := target.requests(); len(got) != 1 || got[0] != "POST /allowed Bearer "+egressSecret {
		t.Errorf("the target got %q; want only the allowed call", got)
	}

	st, reason := endOf(t, db, redirected)
	if st == "COMPLETED" || !strings.Contains(reason, "redirected to "+second.host) {
		t.Errorf("a redirect to another host: %s %q, want a failure with \"redirected to %s\"", st, reason, second.host)
	}
	if got := second.requests(); len(got) != 0 {
		t.Errorf("the host a redirect named got %q; want nothing", got)
	}
	if st, reason := endOf(t, db, sameOrigin); st != "COMPLETED" {
		t.Errorf("follow_redirects: same_origin within the host: %s %q", st, reason)
	}
	var landed bool
	for _, r := range first.requests() {
		landed = landed || r == "POST /landed/8 Bearer "+egressSecret
	}
	if !landed {
		t.Errorf("the same-origin redirect was not followed: %q", first.requests())
	}
}
