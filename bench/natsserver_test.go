package bench

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..")
}

// TestNATSServerVersionIsGoMods: the nats-server the bench builds outside a
// checkout is the version go.mod pins for the tests.
func TestNATSServerVersionIsGoMods(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(), "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*(?:require\s+)?` + regexp.QuoteMeta(natsServerModule) + `\s+(\S+)`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("go.mod requires no %s", natsServerModule)
	}
	if string(m[1]) != natsServerVersion {
		t.Fatalf("go.mod requires %s %s, the bench builds %s: update natsServerVersion", natsServerModule, m[1], natsServerVersion)
	}
}

// TestStartNATSRunsAJetStreamServerProcess: startNATS builds (or finds)
// nats-server, runs it as a child process with JetStream, and Shutdown
// stops it and removes its store.
func TestStartNATSRunsAJetStreamServerProcess(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ns, url, err := startNATS(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			ns.Shutdown()
		}
	}()
	if ns.cmd.Process.Pid == os.Getpid() {
		t.Fatal("nats-server runs in the test's process")
	}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}}); err != nil {
		t.Fatalf("create a JetStream stream: %v", err)
	}
	ack, err := js.Publish(ctx, "t.x", []byte("hello"))
	if err != nil || ack.Sequence != 1 {
		t.Fatalf("publish: %v %+v", err, ack)
	}
	nc.Close()
	ns.Shutdown()
	stopped = true
	if _, err := os.Stat(ns.dir); !os.IsNotExist(err) {
		t.Errorf("the store %s is still there after Shutdown", ns.dir)
	}
	if ns.cmd.ProcessState == nil {
		t.Error("nats-server still runs after Shutdown")
	}
}
