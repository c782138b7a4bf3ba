package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/internal/pgcluster"
	"github.com/compensa/compensa/internal/pgcluster/pgdocker"
	"github.com/compensa/compensa/migrations"
	"github.com/compensa/compensa/test/testkit"
)

// TestSystemdLayoutIsReadableByTheServiceUser lays the files out as the
// comments of deploy/systemd/relay.service say, under a temporary root
// instead of /, with the user they create, and starts `relay run` as that
// user with the environment systemd would give it (relay.env, read as root,
// with RELAY_SAGAS and RELAY_SINKS as the example shows them): the relay
// must read its saga definitions and sinks file and serve its monitor.
func TestSystemdLayoutIsReadableByTheServiceUser(t *testing.T) {
	testkit.SkipShort(t, "creates a system user and runs the relay as it")
	if os.Geteuid() != 0 {
		t.Skip("creating the service user and files owned by it needs root (CI runs as root)")
	}
	unit, err := os.ReadFile("../../deploy/systemd/relay.service")
	if err != nil {
		t.Fatal(err)
	}
	u := unitValues(t, "../../deploy/systemd/relay.service")
	service := u["User"]
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	// The service user must reach the files through root and the test's
	// own temporary folder above it, as it reaches /etc.
	for _, d := range []string{root, filepath.Dir(root)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// What a machine has before the comment's commands run.
	for _, d := range []string{"usr/local/bin", "etc/systemd/system"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(t.TempDir(), "relay")
	build := exec.Command("go", "build", "-o", bin, "./cmd/relay")
	build.Dir = repo
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/relay: %v\n%s", err, out)
	}

	// The comment's commands, with absolute paths moved under root.
	under := func(p string) string {
		if strings.HasPrefix(p, "/") {
			return filepath.Join(root, p)
		}
		if p == "bin/relay" {
			return bin
		}
		return filepath.Join(repo, p)
	}
	var sawUser, sawInstall bool
	for _, line := range strings.Split(string(unit), "\n") {
		cmdline, ok := strings.CutPrefix(line, "#   ")
		if !ok {
			continue
		}
		cmdline, _, _ = strings.Cut(cmdline, "  #")
		words := shellWords(cmdline)
		if len(words) == 0 {
			continue
		}
		switch words[0] {
		case "useradd":
			sawUser = true
			name := words[len(words)-1]
			if name != service {
				t.Fatalf("the comment creates user %s, the unit runs as User=%s", name, service)
			}
			if _, err := user.Lookup(name); err == nil {
				continue // made by an earlier run, or by the machine
			}
			if out, err := exec.Command(words[0], words[1:]...).CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", cmdline, err, out)
			}
			t.Cleanup(func() { exec.Command("userdel", name).Run() })
		case "install":
			sawInstall = true
			args := []string{}
			for i := 1; i < len(words); i++ {
				w := words[i]
				switch {
				case w == "-m" || w == "-o" || w == "-g":
					args = append(args, w, words[i+1])
					i++
				case strings.HasPrefix(w, "-"):
					args = append(args, w)
				default:
					args = append(args, under(w))
				}
			}
			if out, err := exec.Command("install", args...).CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", cmdline, err, out)
			}
		}
	}
	if !sawUser || !sawInstall {
		t.Fatal("relay.service's comments give no useradd and install commands to lay the files out")
	}
	uid, gid := lookupIDs(t, service)

	// The environment: relay.env as installed, its commented-out
	// RELAY_SAGAS and RELAY_SINKS taken as the example shows them.
	b, err := os.ReadFile(filepath.Join(root, "etc/compensa/relay.env"))
	if err != nil {
		t.Fatalf("relay.env not installed where the unit's EnvironmentFile (%s) says: %v", u["EnvironmentFile"], err)
	}
	env := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(line, "# RELAY_"); ok {
			line = "RELAY_" + rest
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(v, "/") {
			v = under(v)
		}
		env[k] = v
	}
	for _, k := range []string{"RELAY_SAGAS", "RELAY_SINKS"} {
		if env[k] == "" {
			t.Fatalf("relay.env.example shows no %s", k)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := pgdocker.Start(ctx, pgcluster.Options{})
	if err != nil {
		t.Fatalf("start PostgreSQL: %v", err)
	}
	t.Cleanup(func() { c.Stop() })
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Apply(ctx, conn, migrations.Options{}); err != nil {
		t.Fatal(err)
	}
	schema, err := os.ReadFile(filepath.Join(repo, "examples/orders/schema.sql"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, string(schema)); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	token := make([]byte, 32)
	rand.Read(token)
	whsec := make([]byte, 24)
	rand.Read(whsec)
	env["RELAY_DATABASE_URL"] = c.URL
	env["RELAY_API_TOKEN"] = hex.EncodeToString(token)
	env["RELAY_HTTP_ADDR"] = addr
	// The example files' secrets, which an operator adds to relay.env.
	env["RELAY_SECRET_PAYMENTS_TOKEN"] = "test-payments-token"
	env["SHIPPING_WEBHOOK_SECRET"] = "whsec_" + base64.StdEncoding.EncodeToString(whsec)

	exe := under("/usr/local/bin/relay")
	cmd := exec.CommandContext(ctx, exe, shellWords(u["ExecStart"])[1:]...)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}}
	logPath := filepath.Join(t.TempDir(), "relay.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	output := func() string { b, _ := os.ReadFile(logPath); return string(b) }
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(40 * time.Second):
			cmd.Process.Kill()
		}
	})

	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/definitions", nil)
	req.Header.Set("Authorization", "Bearer "+env["RELAY_API_TOKEN"])
	deadline := time.Now().Add(90 * time.Second)
	for {
		select {
		case err := <-exited:
			t.Fatalf("relay run as %s exited (%v) with the files laid out as relay.service says:\n%s", service, err, output())
		default:
		}
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				if !strings.Contains(string(body), "order_fulfilment") {
					t.Fatalf("GET /v1/definitions: the saga of RELAY_SAGAS is not loaded: %s", body)
				}
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("relay run as %s did not serve /v1/definitions within 90s:\n%s", service, output())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func lookupIDs(t *testing.T, name string) (uid, gid uint32) {
	t.Helper()
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	a, err1 := strconv.ParseUint(u.Uid, 10, 32)
	b, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		t.Fatalf("user %s: uid %s gid %s", name, u.Uid, u.Gid)
	}
	return uint32(a), uint32(b)
}

// TestSystemdUnitVerifies runs deploy/systemd/relay.service through
// systemd's own parser (systemd-analyze verify), with ExecStart pointed at
// an executable that exists here: an unknown or misspelt key, a bad value
// or a wrong section is a warning there and a failure here.
func TestSystemdUnitVerifies(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed")
	}
	unit, err := os.ReadFile("../../deploy/systemd/relay.service")
	if err != nil {
		t.Fatal(err)
	}
	u := unitValues(t, "../../deploy/systemd/relay.service")
	exe := shellWords(u["ExecStart"])[0]
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(unit), "ExecStart="+exe) {
		t.Fatalf("ExecStart=%s: not found as written", u["ExecStart"])
	}
	path := filepath.Join(t.TempDir(), "relay.service")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(string(unit), "ExecStart="+exe, "ExecStart="+self)), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, analyze, "verify", path).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify relay.service: %v\n%s", err, out)
	}
}
