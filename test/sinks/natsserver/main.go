// Command natsserver runs a real nats-server with JetStream, built from the
// Go module, as a process of its own: the sink fault tests kill it with -9
// and start it again on the same store.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

func main() {
	port := flag.Int("port", 4222, "client port")
	store := flag.String("store", "", "JetStream store folder (required)")
	flag.Parse()
	if *store == "" {
		fmt.Fprintln(os.Stderr, "natsserver: -store is required")
		os.Exit(2)
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: *port, JetStream: true, StoreDir: *store,
		DisableJetStreamBanner: true, NoSigs: false})
	if err != nil {
		fmt.Fprintln(os.Stderr, "natsserver:", err)
		os.Exit(1)
	}
	s.ConfigureLogger()
	go s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		fmt.Fprintln(os.Stderr, "natsserver: not ready after 30s")
		os.Exit(1)
	}
	fmt.Println("ready")
	s.WaitForShutdown()
}
