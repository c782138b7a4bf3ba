package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/compensa/compensa/sink"
	"github.com/compensa/compensa/sink/webhook"
)

func startEndpoint(t *testing.T) *hookEndpoint {
	t.Helper()
	h, err := startHookEndpoint()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// TestHookEndpointServesHTTPClient: net/http's client gets 204 with a Date
// for bodies of every framing (Content-Length, chunked, Expect:
// 100-continue, none), over one keep-alive connection, and the endpoint
// read every body byte.
func TestHookEndpointServesHTTPClient(t *testing.T) {
	h := startEndpoint(t)
	var dials atomic.Int32
	tr := &http.Transport{ExpectContinueTimeout: 5 * time.Second, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	var want int64
	for i := range 30 {
		body := strings.Repeat("x", i*997)
		var req *http.Request
		var err error
		switch i % 3 {
		case 0:
			req, err = http.NewRequest(http.MethodPost, h.URL, strings.NewReader(body))
		case 1: // unknown length: chunked
			req, err = http.NewRequest(http.MethodPost, h.URL, io.MultiReader(strings.NewReader(body)))
		case 2:
			req, err = http.NewRequest(http.MethodPost, h.URL, strings.NewReader(body))
			if err == nil {
				req.Header.Set("Expect", "100-continue")
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent || resp.Header.Get("Date") == "" {
			t.Fatalf("request %d: %s, Date %q; want 204 with a Date", i, resp.Status, resp.Header.Get("Date"))
		}
		want += int64(len(body))
	}
	if got := h.requests.Load(); got != 30 {
		t.Fatalf("%d requests answered; want 30", got)
	}
	if got := h.bytes.Load(); got != want {
		t.Fatalf("%d body bytes read; want %d", got, want)
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d connections for 30 sequential requests; want 1 (keep-alive)", n)
	}
}

func dialEndpoint(t *testing.T, h *hookEndpoint) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimSuffix(strings.TrimPrefix(h.URL, "http://"), "/hook"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

// TestHookEndpointAnswersAfterTheWholeBody: no answer while part of the
// body is still to come.
func TestHookEndpointAnswersAfterTheWholeBody(t *testing.T) {
	h := startEndpoint(t)
	c, br := dialEndpoint(t, h)
	fmt.Fprint(c, "POST /hook HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12345")
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := br.Peek(1); err == nil {
		t.Fatal("the endpoint answered before the body's last 5 bytes were sent")
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprint(c, "67890")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("%s; want 204", resp.Status)
	}
	if h.bytes.Load() != 10 {
		t.Fatalf("%d body bytes read; want 10", h.bytes.Load())
	}
}

// TestHookEndpointConnectionHandling: pipelined requests are answered in
// order; "Connection: close" and HTTP/1.0 close after the answer; a
// malformed request gets 400 and a closed connection.
func TestHookEndpointConnectionHandling(t *testing.T) {
	h := startEndpoint(t)
	cases := []struct {
		name, send string
		statuses   []int
		closed     bool
	}{
		{"pipelined", "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabcPOST /b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
			[]int{204, 204}, false},
		{"close", "POST /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 1\r\n\r\na", []int{204}, true},
		{"http/1.0", "POST /a HTTP/1.0\r\nContent-Length: 1\r\n\r\na", []int{204}, true},
		{"http/1.0 keep-alive", "POST /a HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\na", []int{204}, false},
		{"bad length", "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", []int{400}, true},
		{"two lengths", "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", []int{400}, true},
		{"length and chunked", "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", []int{400}, true},
		{"gzip coding", "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", []int{501}, true},
		{"folded header", "POST /a HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n", []int{400}, true},
		{"no version", "POST /a\r\n\r\n", []int{400}, true},
		{"HTTP/2.0", "POST /a HTTP/2.0\r\n\r\n", []int{505}, true},
		{"expectation", "POST /a HTTP/1.1\r\nHost: x\r\nExpect: something\r\n\r\n", []int{417}, true},
		{"long line", "POST /" + strings.Repeat("a", 9000) + " HTTP/1.1\r\n\r\n", []int{431}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, br := dialEndpoint(t, h)
			c.SetDeadline(time.Now().Add(5 * time.Second))
			fmt.Fprint(c, tc.send)
			for i, want := range tc.statuses {
				resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodPost})
				if err != nil {
					t.Fatalf("answer %d: %v", i, err)
				}
				io.Copy(io.Discard, resp.Body)
				if resp.StatusCode != want {
					t.Fatalf("answer %d: %s; want %d", i, resp.Status, want)
				}
			}
			c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			_, err := br.Peek(1)
			// Closed: EOF, or a reset for the bytes of the request left unread.
			var ne net.Error
			if closed := err != nil && !(errors.As(err, &ne) && ne.Timeout()); closed != tc.closed {
				t.Fatalf("after the answers: %v; want the connection closed: %v", err, tc.closed)
			}
		})
	}
}

// TestHookEndpointTakesTheWebhookSink: the webhook sink delivers a batch of
// many aggregates at the default concurrency, each event's whole envelope
// read before its 2xx.
func TestHookEndpointTakesTheWebhookSink(t *testing.T) {
	h := startEndpoint(t)
	s, err := webhook.New(webhook.Config{URL: h.URL, Secret: "whsec_YmVuY2gtYmVuY2gtYmVuY2gtYmVuY2g=", Concurrency: sink.DefaultWebhookConcurrency})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	evs := make([]*sink.Event, 2000)
	var want int64
	for i := range evs {
		evs[i] = &sink.Event{ID: fmt.Sprintf("id-%d", i), AggregateType: "order", AggregateID: fmt.Sprint(i % 300),
			EventType: "bench.event", CreatedAt: time.Now(), Payload: json.RawMessage(fmt.Sprintf(`{"seq":%d}`, i))}
		want += int64(len(evs[i].Envelope()))
	}
	for i, err := range s.Deliver(context.Background(), evs) {
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	if got := h.requests.Load(); got != int64(len(evs)) {
		t.Fatalf("%d requests answered; want %d", got, len(evs))
	}
	if got := h.bytes.Load(); got != want {
		t.Fatalf("%d body bytes read; want %d (the envelopes)", got, want)
	}
}

// BenchmarkWebhookToHookEndpoint posts batches of 1,000 single-event
// aggregates from the webhook sink to the bench's endpoint, at the default
// concurrency and others, and reports the process's CPU time per event
// (sink and endpoint together; a profile separates them).
func BenchmarkWebhookToHookEndpoint(b *testing.B) {
	for _, c := range []int{8, sink.DefaultWebhookConcurrency, 32, 64} {
		b.Run(fmt.Sprintf("concurrency=%d", c), func(b *testing.B) { benchWebhook(b, c) })
	}
}

func benchWebhook(b *testing.B, concurrency int) {
	h, err := startHookEndpoint()
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	s, err := webhook.New(webhook.Config{URL: h.URL, Secret: "whsec_YmVuY2gtYmVuY2gtYmVuY2gtYmVuY2g=", Concurrency: concurrency})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	b.ReportAllocs()
	evs := make([]*sink.Event, 1000)
	for i := range evs {
		evs[i] = &sink.Event{ID: fmt.Sprintf("0193a5b2-7c4d-7e8f-9a0b-%012d", i), TenantID: "0193a5b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b",
			AggregateType: "order", AggregateID: fmt.Sprint(i), EventType: "bench.event", CreatedAt: time.Now(),
			Payload: json.RawMessage(fmt.Sprintf(`{"seq": %d, "currency": "EUR", "amount_cents": 4200}`, i))}
	}
	began := processCPU()
	for b.Loop() {
		for _, err := range s.Deliver(b.Context(), evs) {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(processCPU()-began)/float64(b.N*len(evs)), "cpu-ns/event")
	b.ReportMetric(float64(b.N*len(evs))/b.Elapsed().Seconds(), "events/s")
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
