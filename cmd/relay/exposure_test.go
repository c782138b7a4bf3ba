package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/internal/pgcluster"
	"github.com/compensa/compensa/internal/pgcluster/pgdocker"
	"github.com/compensa/compensa/migrations"
	"github.com/compensa/compensa/test/testkit"
)

// TestRunRefusesAnOpenMonitorWithoutAToken: `relay run --http-addr
// 0.0.0.0:0` without a token exits 2 with one line saying what to pass;
// with --http-insecure it starts and its page shows the banner.
func TestRunRefusesAnOpenMonitorWithoutAToken(t *testing.T) {
	testkit.SkipShort(t, "starts relays on open addresses")
	if os.Getenv("RELAY_API_TOKEN") != "" || os.Getenv("RELAY_API_TOKENS") != "" {
		t.Skip("RELAY_API_TOKEN or RELAY_API_TOKENS is set in the environment: the test needs a relay without a token")
	}
	t.Parallel()
	_, err := runSagas(t, "postgres://nobody@127.0.0.1:1/db", "run", "--http-addr", "0.0.0.0:0")
	var ee exitError
	if !errors.As(err, &ee) || ee.code != 2 {
		t.Fatalf("run on 0.0.0.0 without a token: %v, want exit 2", err)
	}
	if strings.Contains(ee.msg, "\n") || !strings.Contains(ee.msg, "--api-token") || !strings.Contains(ee.msg, "--api-tokens") || !strings.Contains(ee.msg, "--http-insecure") {
		t.Errorf("message %q: want one line naming --api-token, --api-tokens and --http-insecure", ee.msg)
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
	conn.Close(ctx)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		root := newRootCmd(&rootOptions{})
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs([]string{"run", "--no-stream", "--http-insecure", "--http-addr", "0.0.0.0:" + strconv.Itoa(port), "--database-url", c.URL, "--log-level", "error"})
		done <- root.ExecuteContext(runCtx)
	}()
	var body []byte
	deadline := time.Now().Add(60 * time.Second)
	for {
		res, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/")
		if err == nil {
			body, _ = io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("relay run --http-insecure did not serve its page: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Errorf("relay run stopped with %v", err)
	}
	if !bytes.Contains(body, []byte(`id="insecure"`)) {
		t.Errorf("the page of an insecure monitor has no banner")
	}
}
