package httpapi

import (
	"cmp"
	"net"
	"net/http"
	"sync"
	"time"
)

// ServerConfig bounds the monitor's connections. Every field's zero value
// means the default, which suits a monitor on an internal network.
//
// Only ReadHeaderTimeout used to be set: a slow request body, an idle
// keep-alive connection or a connection that sent a few bytes of a header
// stayed open for as long as the peer liked, and every one of them was
// kept. Each bound below closes one of those doors.
type ServerConfig struct {
	// ReadHeaderTimeout bounds reading a request's headers (default 10s).
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request, body included (default
	// 30s): a login form or a retry reason is a few hundred bytes.
	ReadTimeout time.Duration
	// WriteTimeout bounds writing a response (default 60s): long enough for
	// the largest page (100 stuck and 50 recent instances, the lag chart)
	// on a slow link, short enough that a reader that never reads is let go.
	WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that sends nothing more
	// (default 60s).
	IdleTimeout time.Duration
	// MaxConns caps the open connections (default 256). Connections beyond
	// it are answered 503 and closed at once, so that the ones in use, and
	// the health checks, keep working.
	MaxConns int
}

func (c ServerConfig) withDefaults() ServerConfig {
	c.ReadHeaderTimeout = cmp.Or(c.ReadHeaderTimeout, 10*time.Second)
	c.ReadTimeout = cmp.Or(c.ReadTimeout, 30*time.Second)
	c.WriteTimeout = cmp.Or(c.WriteTimeout, 60*time.Second)
	c.IdleTimeout = cmp.Or(c.IdleTimeout, 60*time.Second)
	c.MaxConns = cmp.Or(c.MaxConns, 256)
	return c
}

// NewHTTPServer is the monitor's http.Server, with every timeout set. Serve
// it on a listener from Listen (or wrap one with LimitListener) so that the
// connection cap holds too.
func NewHTTPServer(h http.Handler, cfg ServerConfig) *http.Server {
	cfg = cfg.withDefaults()
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
	}
}

// Listen opens the monitor's TCP listener with the connection cap of cfg.
func Listen(addr string, cfg ServerConfig) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return LimitListener(ln, cfg.withDefaults().MaxConns), nil
}

// LimitListener lets at most n connections be open at once. A connection
// beyond the cap gets a one-line 503 and is closed, instead of waiting in
// the kernel's backlog where a client cannot tell a full server from a dead
// one.
func LimitListener(ln net.Listener, n int) net.Listener {
	return &limitListener{Listener: ln, slots: make(chan struct{}, max(n, 1))}
}

type limitListener struct {
	net.Listener
	slots chan struct{}
}

// overCapResponse is written to a connection refused by the cap.
const overCapResponse = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nRetry-After: 1\r\nContent-Length: 46\r\n\r\ntoo many open connections to the relay monitor"

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &limitedConn{Conn: c, release: func() { <-l.slots }}, nil
		default:
			// Refuse without blocking Accept: the write has a short
			// deadline so that a peer that does not read cannot hold us.
			go func() {
				_ = c.SetWriteDeadline(time.Now().Add(time.Second))
				_, _ = c.Write([]byte(overCapResponse))
				_ = c.Close()
			}()
		}
	}
}

type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
