package webhook

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"
)

// conns sends requests to a plain-HTTP endpoint over keep-alive HTTP/1.1
// connections of its own, at most one request per connection at a time and
// up to max idle connections kept for the next requests. The request is
// written and its answer read by the goroutine that sends it, with the
// connection's deadline as the timeout: none of the per-request goroutine
// hand-offs, contexts and timers of http.Transport, which cost more CPU than
// a small POST itself. Answers are read with http.ReadResponse. An https endpoint, or a Config.Client
// given by the caller, goes through http.Client instead.
type conns struct {
	addr   string // host:port
	dialer net.Dialer
	max    int

	mu     sync.Mutex
	idle   []*hconn
	closed bool
}

type hconn struct {
	c  net.Conn
	br *bufio.Reader
	bw *bufio.Writer
}

// longAgo is a deadline in the past: it interrupts a blocked read or write.
var longAgo = time.Unix(1, 0)

func newConns(addr string, max int) *conns {
	return &conns{addr: addr, max: max, dialer: net.Dialer{KeepAlive: 30 * time.Second}}
}

func (p *conns) get() *hconn {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.idle); n > 0 {
		c := p.idle[n-1]
		p.idle = p.idle[:n-1]
		return c
	}
	return nil
}

func (p *conns) put(c *hconn) {
	p.mu.Lock()
	if !p.closed && len(p.idle) < p.max {
		p.idle = append(p.idle, c)
		c = nil
	}
	p.mu.Unlock()
	if c != nil {
		c.c.Close()
	}
}

func (p *conns) dial(ctx context.Context, deadline time.Time) (*hconn, error) {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	c, err := p.dialer.DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return nil, err
	}
	return &hconn{c: c, br: bufio.NewReaderSize(c, 4096), bw: bufio.NewWriterSize(c, 4096)}, nil
}

// close closes the idle connections; connections in use are closed when
// their request ends.
func (p *conns) close() {
	p.mu.Lock()
	idle := p.idle
	p.idle, p.closed = nil, true
	p.mu.Unlock()
	for _, c := range idle {
		c.c.Close()
	}
}

// interrupter ends the request in progress on a worker's connection when
// the worker's context ends: one context.AfterFunc (see Sink.Deliver) for
// all the requests of a worker, not one each.
type interrupter struct {
	mu    sync.Mutex
	c     net.Conn // the connection of the request in progress, if any
	ended bool     // the context has ended
}

// interrupt is called once the context ends.
func (in *interrupter) interrupt() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.ended = true
	if in.c != nil {
		in.c.SetDeadline(longAgo)
	}
}

// begin makes c the connection of the request in progress; false when the
// context has ended already.
func (in *interrupter) begin(c net.Conn) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.c = c
	return !in.ended
}

// end ends the request in progress; true when the context ended meanwhile.
func (in *interrupter) end() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.c = nil
	return in.ended
}

// errStale is a reused connection that the endpoint had closed before the
// request reached it: the request is sent again on a new connection.
var errStale = errors.New("keep-alive connection closed by the endpoint")

// roundTrip sends the request head (see Sink.appendHead) and body, and
// returns the answer to req (its method and URL) with its body read (up
// to 64 KiB, the rest discarded with the connection). A 3xx is returned,
// not followed. ctx ends the request early; timeout bounds it as a whole.
// in is the calling worker's interrupter, which ctx ends.
func (p *conns) roundTrip(ctx context.Context, in *interrupter, req *http.Request, head, body []byte, timeout time.Duration) (*http.Response, error) {
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	for attempt := 0; ; attempt++ {
		// A retry after a stale connection dials a new one: the other
		// idle connections may be stale too.
		var c *hconn
		if attempt == 0 {
			c = p.get()
		}
		reused := c != nil
		if c == nil {
			var err error
			if c, err = p.dial(ctx, deadline); err != nil {
				return nil, err
			}
		}
		resp, err := p.send(ctx, in, c, req, head, body, deadline, reused)
		if errors.Is(err, errStale) && attempt == 0 {
			continue
		}
		return resp, err
	}
}

func (p *conns) send(ctx context.Context, in *interrupter, c *hconn, req *http.Request, head, body []byte, deadline time.Time, reused bool) (resp *http.Response, err error) {
	keep := false
	defer func() {
		if keep {
			p.put(c)
		} else {
			c.c.Close()
		}
	}()
	c.c.SetDeadline(deadline)
	if !in.begin(c.c) {
		return nil, context.Cause(ctx)
	}
	defer func() {
		if in.end() {
			// ctx ended during the request and may have moved the
			// deadline into the past: the connection is not reused.
			keep = false
		}
		switch {
		case err == nil:
		case ctx.Err() != nil:
			err = context.Cause(ctx)
		case errors.Is(err, os.ErrDeadlineExceeded):
			err = fmt.Errorf("no answer within the timeout: %w", err)
		}
	}()
	c.bw.Write(head)
	c.bw.Write(body)
	if werr := c.bw.Flush(); werr != nil {
		// The endpoint may have answered before it read the whole body
		// (413) and closed the connection: that answer counts.
		if _, err := c.br.Peek(1); err == nil {
			if resp, _, err = readAnswer(c.br, req); err == nil {
				return resp, nil
			}
		}
		if reused {
			return nil, fmt.Errorf("%w: %w", errStale, werr)
		}
		return nil, werr
	}
	if _, err := c.br.Peek(1); err != nil {
		if reused && !errors.Is(err, os.ErrDeadlineExceeded) {
			// Nothing came back on a connection the endpoint had closed
			// while it was idle: the request did not reach it.
			return nil, fmt.Errorf("%w: %w", errStale, err)
		}
		return nil, err
	}
	resp, whole, err := readAnswer(c.br, req)
	if err != nil {
		return nil, err
	}
	// The connection is reused only when the whole answer was read and the
	// endpoint keeps it open.
	keep = whole && !resp.Close
	return resp, nil
}

// readAnswer reads the answer to req from br, past interim ones (100
// Continue, 103 Early Hints), and up to 64 KiB of its body; whole is false
// when the body was not read to its end (too long, or cut off): the
// connection cannot carry another request then. A body cut off does not
// undo the status.
func readAnswer(br *bufio.Reader, req *http.Request) (resp *http.Response, whole bool, err error) {
	if resp, whole, ok := readPlain2xx(br); ok {
		return resp, whole, nil
	}
	for {
		resp, err = http.ReadResponse(br, req)
		if err != nil {
			return nil, false, err
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			continue
		}
		n, err := io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		whole = err == nil && (n < 64<<10 || drained(resp.Body))
		resp.Body.Close()
		resp.Body = http.NoBody
		return resp, whole, nil
	}
}

// drained reports whether body has nothing left to read.
func drained(body io.Reader) bool {
	var b [1]byte
	n, err := body.Read(b[:])
	return n == 0 && err == io.EOF
}

// readPlain2xx reads the most common answer without http.ReadResponse's
// allocations: an HTTP/1.1 2xx whose head br already holds whole, with a
// body of a Content-Length up to 64 KiB (or none, for 204), and no
// Connection, Transfer-Encoding or folded header field. ok is false, with
// nothing read, for any other answer: http.ReadResponse reads it then.
// whole is as for readAnswer.
func readPlain2xx(br *bufio.Reader) (resp *http.Response, whole, ok bool) {
	buf, _ := br.Peek(br.Buffered())
	end := bytes.Index(buf, []byte("\r\n\r\n"))
	if end < 0 {
		return nil, false, false
	}
	head := buf[:end+2] // each line ends in CRLF
	first, rest, _ := bytes.Cut(head, []byte("\r\n"))
	if len(first) < 12 || string(first[:10]) != "HTTP/1.1 2" || !isDigit(first[10]) || !isDigit(first[11]) ||
		(len(first) > 12 && first[12] != ' ') || bytes.ContainsAny(first, "\r\n\x00") {
		return nil, false, false
	}
	code := 200 + int(first[10]-'0')*10 + int(first[11]-'0')
	length := int64(-1)
	for len(rest) > 0 {
		var line []byte
		line, rest, _ = bytes.Cut(rest, []byte("\r\n"))
		name, value, found := bytes.Cut(line, []byte(":"))
		if !found || len(name) == 0 || bytes.ContainsAny(line, "\r\n\x00") || bytes.ContainsAny(name, " \t") {
			return nil, false, false
		}
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			value = bytes.Trim(value, " \t")
			if length >= 0 || len(value) == 0 || len(value) > 5 {
				return nil, false, false
			}
			length = 0
			for _, c := range value {
				if !isDigit(c) {
					return nil, false, false
				}
				length = length*10 + int64(c-'0')
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")), bytes.EqualFold(name, []byte("Connection")):
			return nil, false, false
		}
	}
	if code == http.StatusNoContent {
		length = 0 // a 204 has no body, whatever its head says
	}
	if length < 0 || length > 64<<10 {
		return nil, false, false
	}
	status := string(first[9:])
	if len(first) == 12 {
		status += " " + http.StatusText(code)
	}
	br.Discard(end + 4)
	n, _ := br.Discard(int(length))
	return &http.Response{Status: status, StatusCode: code, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Body: http.NoBody, ContentLength: length}, int64(n) == length, true
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }
