package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// hookEndpoint is the webhook endpoint of the sink scenarios: an HTTP/1.1
// server on the loopback interface that reads each request whole (its head,
// then its body by Content-Length or chunked transfer coding) and only then
// answers 204 No Content, keeping the connection open for the next request
// (HTTP/1.0 and "Connection: close" close it after the answer). A malformed
// request is answered 400 (431 for a head line over 8 KiB, 501 for a
// transfer coding other than chunked, 505 for a protocol other than HTTP/1.0
// and 1.1, 417 for an expectation other than 100-continue) and its
// connection closed. It does
// what a receiver on another machine does for the sink, at a fraction of
// net/http's CPU per request: one goroutine per connection reading with one
// buffer, no per-request allocations, an answer of one write.
type hookEndpoint struct {
	URL string

	ln       net.Listener
	wg       sync.WaitGroup
	requests atomic.Int64 // answered 2xx
	bytes    atomic.Int64 // body bytes read by the 2xx answers

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool

	date atomic.Pointer[dateLine]
}

// dateLine is the Date header of the answers sent within one second.
type dateLine struct {
	sec  int64
	line []byte
}

// startHookEndpoint listens on a free loopback port and serves until Close.
func startHookEndpoint() (*hookEndpoint, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("bench: start the webhook endpoint: %w", err)
	}
	h := &hookEndpoint{URL: "http://" + ln.Addr().String() + "/hook", ln: ln, conns: map[net.Conn]struct{}{}}
	h.wg.Add(1)
	go h.accept()
	return h, nil
}

// Close stops listening, closes every connection and waits for their
// goroutines.
func (h *hookEndpoint) Close() {
	h.ln.Close()
	h.mu.Lock()
	h.closed = true
	for c := range h.conns {
		c.Close()
	}
	h.mu.Unlock()
	h.wg.Wait()
}

func (h *hookEndpoint) accept() {
	defer h.wg.Done()
	for {
		c, err := h.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			c.Close()
			return
		}
		h.conns[c] = struct{}{}
		h.wg.Add(1)
		h.mu.Unlock()
		go h.serve(c)
	}
}

// maxHeadLine bounds one line of a request's head (the reader's buffer).
const maxHeadLine = 8 << 10

// errBadRequest carries the status a malformed request is answered with.
type errBadRequest struct {
	status int
	why    string
}

func (e *errBadRequest) Error() string { return strconv.Itoa(e.status) + " " + e.why }

func bad(status int, why string) error { return &errBadRequest{status, why} }

func (h *hookEndpoint) serve(c net.Conn) {
	defer h.wg.Done()
	defer func() {
		h.mu.Lock()
		delete(h.conns, c)
		h.mu.Unlock()
		c.Close()
	}()
	br := bufio.NewReaderSize(c, maxHeadLine)
	out := make([]byte, 0, 128)
	for {
		req, err := readHead(br)
		if err == nil && req.expectContinue {
			_, err = c.Write([]byte("HTTP/1.1 100 Continue\r\n\r\n"))
		}
		var n int64
		if err == nil {
			n, err = req.readBody(br)
		}
		if err != nil {
			var b *errBadRequest
			if errors.As(err, &b) {
				c.Write([]byte("HTTP/1.1 " + strconv.Itoa(b.status) + " " + http.StatusText(b.status) +
					"\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"))
			}
			return
		}
		h.requests.Add(1)
		h.bytes.Add(n)
		out = append(out[:0], "HTTP/1.1 204 No Content\r\n"...)
		out = append(out, h.dateLine()...)
		if req.close {
			out = append(out, "Connection: close\r\n"...)
		}
		out = append(out, "\r\n"...)
		if _, err := c.Write(out); err != nil || req.close {
			return
		}
	}
}

// dateLine returns "Date: <now>\r\n", formatted once a second.
func (h *hookEndpoint) dateLine() []byte {
	now := time.Now()
	if d := h.date.Load(); d != nil && d.sec == now.Unix() {
		return d.line
	}
	d := &dateLine{sec: now.Unix(), line: []byte("Date: " + now.UTC().Format(http.TimeFormat) + "\r\n")}
	h.date.Store(d)
	return d.line
}

// hookRequest is what the endpoint keeps of a request's head.
type hookRequest struct {
	length         int64 // -1: none given
	chunked        bool
	close          bool
	expectContinue bool
}

// readHead reads a request line and header fields. io.EOF before the first
// byte is a connection the client closed between requests.
func readHead(br *bufio.Reader) (hookRequest, error) {
	req := hookRequest{length: -1}
	line, err := readLine(br)
	if err != nil {
		return req, err
	}
	if len(line) == 0 { // an empty line before a request line is ignored
		if line, err = readLine(br); err != nil {
			return req, err
		}
	}
	method, rest, ok1 := bytes.Cut(line, []byte(" "))
	target, proto, ok2 := bytes.Cut(rest, []byte(" "))
	if !ok1 || !ok2 || len(method) == 0 || len(target) == 0 {
		return req, bad(http.StatusBadRequest, "malformed request line")
	}
	switch string(proto) {
	case "HTTP/1.1":
	case "HTTP/1.0":
		req.close = true
	default:
		return req, bad(http.StatusHTTPVersionNotSupported, "unsupported protocol")
	}
	keepAlive := false
	for {
		line, err := readLine(br)
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return req, err
		}
		if len(line) == 0 {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			return req, bad(http.StatusBadRequest, "obsolete line folding")
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok || len(name) == 0 || bytes.ContainsAny(name, " \t") {
			return req, bad(http.StatusBadRequest, "malformed header field")
		}
		value = bytes.Trim(value, " \t")
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			n, err := strconv.ParseInt(string(value), 10, 64)
			if err != nil || value[0] < '0' || value[0] > '9' || (req.length >= 0 && req.length != n) {
				return req, bad(http.StatusBadRequest, "bad Content-Length")
			}
			req.length = n
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			if !bytes.EqualFold(value, []byte("chunked")) {
				return req, bad(http.StatusNotImplemented, "unsupported transfer coding")
			}
			req.chunked = true
		case bytes.EqualFold(name, []byte("Connection")):
			for _, opt := range bytes.Split(value, []byte(",")) {
				opt = bytes.Trim(opt, " \t")
				req.close = req.close || bytes.EqualFold(opt, []byte("close"))
				keepAlive = keepAlive || bytes.EqualFold(opt, []byte("keep-alive"))
			}
		case bytes.EqualFold(name, []byte("Expect")):
			if !bytes.EqualFold(value, []byte("100-continue")) {
				return req, bad(http.StatusExpectationFailed, "unsupported expectation")
			}
			req.expectContinue = string(proto) == "HTTP/1.1"
		}
	}
	if string(proto) == "HTTP/1.0" && keepAlive && !req.chunked {
		req.close = false
	}
	if req.chunked && req.length >= 0 {
		return req, bad(http.StatusBadRequest, "both Content-Length and Transfer-Encoding")
	}
	return req, nil
}

// readLine reads one line of a request's head without its CRLF (or LF).
func readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		return nil, bad(http.StatusRequestHeaderFieldsTooLarge, "head line too long")
	}
	if err != nil {
		if err == io.EOF && len(line) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

// readBody reads and discards the request's body, returning its length.
func (req hookRequest) readBody(br *bufio.Reader) (int64, error) {
	if !req.chunked {
		if req.length <= 0 {
			return 0, nil
		}
		n, err := br.Discard(int(req.length))
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return int64(n), err
	}
	var total int64
	for {
		line, err := readLine(br)
		if err != nil {
			return total, err
		}
		size, _, _ := bytes.Cut(line, []byte(";")) // chunk extensions are ignored
		n, err := strconv.ParseInt(string(bytes.Trim(size, " \t")), 16, 64)
		if err != nil || n < 0 {
			return total, bad(http.StatusBadRequest, "bad chunk size")
		}
		if n == 0 {
			for { // trailer fields, up to the empty line
				line, err := readLine(br)
				if err != nil {
					return total, err
				}
				if len(line) == 0 {
					return total, nil
				}
			}
		}
		if _, err := br.Discard(int(n)); err != nil {
			return total, io.ErrUnexpectedEOF
		}
		total += n
		line, err = readLine(br)
		if err != nil {
			return total, err
		}
		if len(line) != 0 {
			return total, bad(http.StatusBadRequest, "chunk not followed by CRLF")
		}
	}
}
