package relay_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/compensa/compensa/relay"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/test/pgtest"
)

// TestMonitorOnAnOpenAddressNeedsAToken: on a non-loopback address the
// relay refuses to start without a token; HTTPInsecure starts it and the
// page shows the banner; a loopback address needs nothing.
func TestMonitorOnAnOpenAddressNeedsAToken(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := t.Context()
	cfg := relay.Config{DatabaseURL: db.URL, Registry: orderRegistry(t), Slot: db.Slot, Publication: db.Publication,
		Workers: 1, NoStream: true, HTTPAddr: "0.0.0.0:0"}

	_, err := relay.New(ctx, cfg)
	if !errors.Is(err, saga.ErrInvalid) || !strings.Contains(err.Error(), "not a loopback address") || !strings.Contains(err.Error(), "HTTPInsecure") {
		t.Fatalf("New on 0.0.0.0 without a token: %v, want ErrExposed naming the way out", err)
	}

	cfg.HTTPInsecure = true
	r, err := relay.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := r.Stop(sctx); err != nil {
			t.Error(err)
		}
	}()
	_, port, _ := strings.Cut(r.Addr(), "]:")
	if port == "" {
		_, port, _ = strings.Cut(r.Addr(), ":")
	}
	res, err := http.Get("http://127.0.0.1:" + port + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.Contains(string(body), `id="insecure"`) {
		t.Fatalf("page of an insecure monitor: %d, banner shown: %v", res.StatusCode, strings.Contains(string(body), `id="insecure"`))
	}

	// Loopback: no banner needed, no token needed.
	cfg.HTTPAddr, cfg.HTTPInsecure = "127.0.0.1:0", false
	if _, err := relay.New(ctx, cfg); err != nil {
		t.Fatalf("loopback without a token: %v", err)
	}
}

// TestAPITokensFileIsValidatedByNew: every problem of the file, with its
// position, before anything starts; weak secrets are refused too.
func TestAPITokensFileIsValidatedByNew(t *testing.T) {
	t.Setenv("RELAY_TEST_WEAK_TOKEN", "abc")
	file := filepath.Join(t.TempDir(), "tokens.yaml")
	if err := os.WriteFile(file, []byte("tokens:\n  - name: ops\n    token_env: RELAY_TEST_WEAK_TOKEN\n    tenant: x\n    role: operate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := relay.New(context.Background(), relay.Config{DatabaseURL: "postgres://u@127.0.0.1:1/db", Registry: saga.NewRegistry(), APITokensFile: file})
	if !errors.Is(err, saga.ErrInvalid) || !strings.Contains(err.Error(), file+":3:16: the token in RELAY_TEST_WEAK_TOKEN is too weak") ||
		!strings.Contains(err.Error(), file+`:4:13: tenant "x" is not a UUID`) {
		t.Fatalf("New with a bad token file: %v", err)
	}
}
