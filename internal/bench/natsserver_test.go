package bench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// TestRelayBinaryLinksNoNATSServer: the relay binary's packages include no
// NATS server (the bench runs nats-server as a process); test binaries may.
func TestRelayBinaryLinksNoNATSServer(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "./cmd/relay")
	cmd.Dir = repoRoot()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps ./cmd/relay: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, natsServerModule+"/") || p == natsServerModule {
			t.Errorf("cmd/relay links %s: keep the NATS server out of the product binary (start nats-server as a process, see natsserver.go)", p)
		}
	}
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
