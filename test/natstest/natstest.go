// Package natstest runs a real nats-server with JetStream inside the test
// process, on a fixed port and store so that it can be stopped and started
// again (a broker outage) while clients reconnect. The suites that kill the
// broker with -9 run it as a process of its own instead (test/sinks'
// natsserver command).
package natstest

import (
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Server is an embedded nats-server.
type Server struct {
	opts *server.Options
	srv  *server.Server
}

// Start starts a server on a free port with JetStream storing under a
// temporary folder; it is shut down when the test ends. Each tweak may
// change the server's options (a smaller MaxPayload, say).
func Start(t testing.TB, tweaks ...func(*server.Options)) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	s := &Server{opts: &server.Options{Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: t.TempDir(),
		NoLog: true, NoSigs: true, DisableJetStreamBanner: true}}
	for _, tw := range tweaks {
		tw(s.opts)
	}
	s.Restart(t)
	t.Cleanup(s.Stop)
	return s
}

// URL is the client URL.
func (s *Server) URL() string { return s.srv.ClientURL() }

// Stop shuts the server down (clients see it gone).
func (s *Server) Stop() {
	if s.srv != nil {
		s.srv.Shutdown()
		s.srv.WaitForShutdown()
	}
}

// Restart starts the server again on the same port and store.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	srv, err := server.NewServer(s.opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	s.srv = srv
}
