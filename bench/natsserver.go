package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// natsServerModule and natsServerVersion name the nats-server the sinks
// scenario runs as a process of its own, built from its Go module on first
// use: the relay binary does not link a NATS server. The version is the one
// go.mod requires (a test compares them).
const (
	natsServerModule  = "github.com/nats-io/nats-server/v2"
	natsServerVersion = "v2.15.2"
)

// natsServerBinary returns the path of the nats-server binary, building it
// into the user's cache folder when it is not there yet: inside this
// repository's module (the version its go.mod pins, from the module cache)
// when the bench runs from a checkout, else with go install at
// natsServerVersion.
func natsServerBinary(ctx context.Context) (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "compensa", "nats-server-"+natsServerVersion)
	bin := filepath.Join(dir, "nats-server")
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("bench: nats-server: %w", err)
	}
	// Built to a temporary name and renamed: a run interrupted mid-build
	// leaves no half-written binary behind.
	tmp := filepath.Join(dir, fmt.Sprintf(".nats-server-%d", os.Getpid()))
	defer os.Remove(tmp)
	var cmd *exec.Cmd
	built := tmp
	if root := compensaModuleRoot(ctx); root != "" {
		cmd = exec.CommandContext(ctx, "go", "build", "-o", tmp, natsServerModule)
		cmd.Dir = root
	} else {
		gobin := filepath.Join(dir, fmt.Sprintf(".gobin-%d", os.Getpid()))
		defer os.RemoveAll(gobin)
		cmd = exec.CommandContext(ctx, "go", "install", natsServerModule+"@"+natsServerVersion)
		cmd.Env = append(os.Environ(), "GOBIN="+gobin)
		built = filepath.Join(gobin, "nats-server")
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("bench: build nats-server (%s): %v: %s: the sinks scenario runs nats-server, built with Go from %s@%s",
			strings.Join(cmd.Args, " "), err, bytes.TrimSpace(out), natsServerModule, natsServerVersion)
	}
	if built != tmp {
		if err := os.Rename(built, tmp); err != nil {
			return "", fmt.Errorf("bench: nats-server: %w", err)
		}
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", fmt.Errorf("bench: nats-server: %w", err)
	}
	return bin, nil
}

// compensaModuleRoot is the folder of this repository's go.mod when the
// current directory is inside a checkout, else "".
func compensaModuleRoot(ctx context.Context) string {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return ""
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return ""
	}
	b, err := os.ReadFile(gomod)
	if err != nil || !bytes.HasPrefix(b, []byte("module github.com/compensa/compensa\n")) {
		return ""
	}
	return filepath.Dir(gomod)
}

// natsServer is a nats-server process with JetStream on a free port,
// storing in a temporary folder removed at Shutdown.
type natsServer struct {
	cmd  *exec.Cmd
	dir  string
	done chan struct{}
}

// startNATS starts nats-server and waits until it accepts connections.
func startNATS(ctx context.Context) (*natsServer, string, error) {
	bin, err := natsServerBinary(ctx)
	if err != nil {
		return nil, "", err
	}
	dir, err := os.MkdirTemp("", "compensa-bench-nats-")
	if err != nil {
		return nil, "", err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.RemoveAll(dir)
		return nil, "", err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(bin, "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	// Gone with the bench, even when it is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, "", fmt.Errorf("bench: start nats-server: %w", err)
	}
	n := &natsServer{cmd: cmd, dir: dir, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(n.done)
	}()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return n, "nats://" + addr, nil
		}
		select {
		case <-n.done:
			os.RemoveAll(dir)
			return nil, "", fmt.Errorf("bench: nats-server exited at start: %s", bytes.TrimSpace(stderr.Bytes()))
		case <-ctx.Done():
			n.Shutdown()
			return nil, "", ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			n.Shutdown()
			return nil, "", errors.New("bench: nats-server not ready after 30s")
		}
	}
}

// Shutdown stops the server (SIGTERM, then SIGKILL after 10 s) and removes
// its store.
func (n *natsServer) Shutdown() {
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(10 * time.Second):
		_ = n.cmd.Process.Kill()
		<-n.done
	}
	os.RemoveAll(n.dir)
}
