package webhook_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/sink/sinktest"
	"github.com/compensa/compensa/sink/webhook"
)

// countingServer is a real HTTP server that answers with answer and counts
// the connections it accepted.
func countingServer(t *testing.T, answer http.HandlerFunc) (*httptest.Server, *atomic.Int32) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(answer)
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &conns
}

func noContent(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	w.WriteHeader(http.StatusNoContent)
}

func requireNoErrors(t *testing.T, errs []error) {
	t.Helper()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("event %d: %v (%s)", i, err, sink.Classify(err))
		}
	}
}

// Requests reuse keep-alive connections: never more connections than
// aggregates delivered at once, across Deliver calls.
func TestKeepAliveConnectionsAreReused(t *testing.T) {
	var got atomic.Int32
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		got.Add(1)
		noContent(w, r)
	})
	s, err := webhook.New(webhook.Config{URL: srv.URL + "/hook?token=x", Secret: secret, Timeout: 2 * time.Second, Concurrency: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for range 3 {
		requireNoErrors(t, s.Deliver(t.Context(), sinktest.Events(200, 40)))
	}
	if got.Load() != 600 {
		t.Fatalf("endpoint got %d requests, want 600", got.Load())
	}
	if n := conns.Load(); n < 1 || n > 4 {
		t.Fatalf("%d connections for 600 requests at concurrency 4, want 1 to 4", n)
	}
}

// A keep-alive connection the endpoint closed while it was idle costs no
// delivery: the request goes again on a new connection.
func TestClosedIdleConnectionIsRedialed(t *testing.T) {
	var got atomic.Int32
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		got.Add(1)
		noContent(w, r)
	})
	s, err := webhook.New(webhook.Config{URL: srv.URL, Secret: secret, Timeout: 2 * time.Second, Concurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	requireNoErrors(t, s.Deliver(t.Context(), sinktest.Events(4, 2)))
	srv.CloseClientConnections()
	time.Sleep(50 * time.Millisecond) // the close reaches the client's socket
	requireNoErrors(t, s.Deliver(t.Context(), sinktest.Events(4, 2)))
	if got.Load() != 8 || conns.Load() < 2 {
		t.Fatalf("%d requests on %d connections, want 8 on new connections after the close", got.Load(), conns.Load())
	}
}

// An endpoint that closes each connection after its answer, or answers
// with a body larger than what is read, still gets every event.
func TestConnectionCloseAndLargeAnswers(t *testing.T) {
	var got atomic.Int32
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if got.Add(1)%2 == 0 {
			w.Header().Set("Connection", "close")
			w.WriteHeader(http.StatusOK)
			return
		}
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, strings.Repeat("x", 200<<10))
	})
	s, err := webhook.New(webhook.Config{URL: srv.URL, Secret: secret, Timeout: 2 * time.Second, Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	requireNoErrors(t, s.Deliver(t.Context(), sinktest.Events(6, 1)))
	if got.Load() != 6 || conns.Load() != 6 {
		t.Fatalf("%d requests on %d connections, want 6 on 6 (none of them reusable)", got.Load(), conns.Load())
	}
}

// An endpoint that does not answer within the timeout makes the event fail
// as "down" with a message that says so; the next delivery works.
func TestTimeoutAndCancel(t *testing.T) {
	var slow atomic.Bool
	release := make(chan struct{})
	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if slow.Load() {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		w.WriteHeader(http.StatusNoContent)
	})
	defer close(release)
	s, err := webhook.New(webhook.Config{URL: srv.URL, Secret: secret, Timeout: 200 * time.Millisecond, Concurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	requireNoErrors(t, s.Deliver(t.Context(), sinktest.Events(2, 2)))

	slow.Store(true)
	began := time.Now()
	errs := s.Deliver(t.Context(), sinktest.Events(2, 1))
	if errs[0] == nil || sink.Classify(errs[0]) != "down" || !strings.Contains(errs[0].Error(), "timeout") || !errors.Is(errs[1], sink.ErrHeldBack) {
		t.Fatalf("errors %v, want the first down on a timeout and the second held back", errs)
	}
	if took := time.Since(began); took > 2*time.Second {
		t.Fatalf("took %s with a timeout of 200ms", took)
	}

	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(50*time.Millisecond, cancel)
	s2, err := webhook.New(webhook.Config{URL: srv.URL, Secret: secret, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	began = time.Now()
	if err := s2.Deliver(ctx, sinktest.Events(1, 1))[0]; !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Fatalf("a cancelled delivery took %s", took)
	}

	slow.Store(false)
	requireNoErrors(t, s.Deliver(t.Context(), sinktest.Events(2, 2)))
}

// A plain-HTTP endpoint receives from the sink's own connections the same
// request as through http.Client: method, URI, Host, headers and body.
func TestPlainHTTPRequestIsHTTPClients(t *testing.T) {
	type seen struct {
		method, uri, host, proto string
		length                   int64
		header                   http.Header
		body                     string
	}
	var mu sync.Mutex
	var got []seen
	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h := r.Header.Clone()
		h.Del("Webhook-Timestamp")
		h.Del("Webhook-Signature")
		h.Del("Accept-Encoding") // http.Transport asks for gzip answers
		mu.Lock()
		got = append(got, seen{r.Method, r.RequestURI, r.Host, r.Proto, r.ContentLength, h, string(body)})
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	evs := sinktest.Events(1, 1)
	evs[0].Headers = []byte(`{"user-agent":"  shop/1.0 ","X-Spaced":" a b ","x_under":"v","n":7,"obj":{"k":[1]},"x-dup":"1","X-Dup":"2"}`)
	for _, client := range []*http.Client{nil, {}} {
		s, err := webhook.New(webhook.Config{URL: srv.URL + "/in/hook?token=a%20b&x=1", Secret: secret, Timeout: 2 * time.Second, Client: client})
		if err != nil {
			t.Fatal(err)
		}
		requireNoErrors(t, s.Deliver(t.Context(), evs))
		s.Close()
	}
	if len(got) != 2 {
		t.Fatalf("%d requests, want 2", len(got))
	}
	if !reflect.DeepEqual(got[0], got[1]) {
		t.Fatalf("own connection:\n%+v\nhttp.Client:\n%+v", got[0], got[1])
	}
	if got[0].header.Get("User-Agent") != "shop/1.0" || got[0].uri != "/in/hook?token=a%20b&x=1" || got[0].header.Get("Content-Type") != "application/json" ||
		len(got[0].header["X-Dup"]) != 1 || got[0].header.Get("X-Dup") != "1" || got[0].header.Get("X_under") != "v" {
		t.Fatalf("request %+v", got[0])
	}
}

// An endpoint that refuses a large event with 413 before reading its body,
// and closes the connection, gets the event refused (parked), not the sink
// taken for down; the next event goes through.
func TestEarlyRefusalOfALargeBody(t *testing.T) {
	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > 1<<20 {
			w.Header().Set("Connection", "close")
			w.WriteHeader(http.StatusRequestEntityTooLarge)
			return
		}
		noContent(w, r)
	})
	s, err := webhook.New(webhook.Config{URL: srv.URL, Secret: secret, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	requireNoErrors(t, s.Deliver(t.Context(), sinktest.Events(1, 1)))
	evs := sinktest.Events(2, 2)
	evs[0].Payload = []byte(`{"big":"` + strings.Repeat("x", 16<<20) + `"}`)
	errs := s.Deliver(t.Context(), evs)
	if errs[0] == nil || sink.Classify(errs[0]) != "event" || !strings.Contains(errs[0].Error(), "413") {
		t.Fatalf("large event: %v (%s), want it refused with 413", errs[0], sink.Classify(errs[0]))
	}
	if errs[1] != nil {
		t.Fatalf("small event: %v", errs[1])
	}
}

// scriptedEndpoint is an HTTP/1.1 endpoint that reads each request whole
// and writes answer as it is, in parts with a pause between them, closing
// the connection after it when closeAfter; it counts connections.
func scriptedEndpoint(t *testing.T, closeAfter bool, answer ...string) (string, *atomic.Int32) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns atomic.Int32
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					for i, part := range answer {
						if i > 0 {
							time.Sleep(30 * time.Millisecond)
						}
						if _, err := io.WriteString(c, part); err != nil {
							return
						}
					}
					if closeAfter {
						return
					}
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String() + "/hook", &conns
}

// Answers are read as http.ReadResponse reads them, whatever their framing:
// every event is delivered (or refused) as the status says, and a
// connection is reused exactly when its answer was read to its end and the
// endpoint keeps it.
func TestAnswersAreReadWhateverTheirFraming(t *testing.T) {
	big := strings.Repeat("x", 100_000)
	cases := []struct {
		name       string
		answer     []string
		closeAfter bool
		conns      int32
		down       bool
	}{
		{"204 with a Date", []string{"HTTP/1.1 204 No Content\r\nDate: Tue, 01 Dec 2026 19:00:00 GMT\r\n\r\n"}, false, 1, false},
		{"200 with a body", []string{"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/plain\r\n\r\nhello"}, false, 1, false},
		{"201 without a reason", []string{"HTTP/1.1 201\r\nContent-Length: 0\r\n\r\n"}, false, 1, false},
		{"204 with a length", []string{"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"}, false, 1, false},
		{"body until close", []string{"HTTP/1.1 200 OK\r\n\r\nuntil the end"}, true, 3, false},
		{"Connection: close", []string{"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"}, true, 3, false},
		{"chunked", []string{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"}, false, 1, false},
		{"interim answer", []string{"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n"}, false, 1, false},
		{"HTTP/1.0 keep-alive", []string{"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok"}, false, 1, false},
		{"body over 64 KiB", []string{"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + big}, false, 3, false},
		{"head in two parts", []string{"HTTP/1.1 204 No", " Content\r\n\r\n"}, false, 1, false},
		{"body after the head", []string{"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", "hello"}, false, 1, false},
		{"LF line ends", []string{"HTTP/1.1 200 OK\nContent-Length: 2\n\nok"}, false, 1, false},
		{"503", []string{"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"}, false, 1, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			url, conns := scriptedEndpoint(t, tc.closeAfter, tc.answer...)
			s, err := webhook.New(webhook.Config{URL: url, Secret: secret, Timeout: 5 * time.Second, Concurrency: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if tc.down {
				errs := s.Deliver(t.Context(), sinktest.Events(1, 1))
				if errs[0] == nil || sink.Classify(errs[0]) != "down" || !strings.Contains(errs[0].Error(), "503 Service Unavailable") {
					t.Fatalf("got %v (%s), want down with 503 Service Unavailable", errs[0], sink.Classify(errs[0]))
				}
				return
			}
			for range 3 {
				requireNoErrors(t, s.Deliver(t.Context(), sinktest.Events(1, 1)))
			}
			if n := conns.Load(); n != tc.conns {
				t.Fatalf("3 requests on %d connections, want %d", n, tc.conns)
			}
		})
	}
}
