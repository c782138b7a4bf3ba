package relay_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/compensa/compensa/relay"
	"github.com/compensa/compensa/saga"
)

// TestSinksFileIsCheckedTheSameWithoutTheStream: a webhook whose secret_env
// is not set is refused by New before anything connects, whether the relay
// streams or runs only its workers (--no-stream).
func TestSinksFileIsCheckedTheSameWithoutTheStream(t *testing.T) {
	const env = "COMPENSA_TEST_UNSET_WEBHOOK_SECRET"
	os.Unsetenv(env)
	file := filepath.Join(t.TempDir(), "sinks.yaml")
	yaml := "sinks:\n  - name: hook\n    webhook:\n      url: http://127.0.0.1:1/events\n      secret_env: " + env + "\n"
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, noStream := range []bool{false, true} {
		// Nothing listens at this address: the check comes first.
		_, err := relay.New(context.Background(), relay.Config{DatabaseURL: "postgres://u@127.0.0.1:1/db", Registry: saga.NewRegistry(), Sinks: file, NoStream: noStream})
		if err == nil || !strings.Contains(err.Error(), env+" (secret_env) is not set") || !strings.Contains(err.Error(), "sinks.yaml:2") {
			t.Errorf("NoStream=%t: New = %v, want the unset secret_env named with its file and line", noStream, err)
		}
	}
}

// TestUnsignedWebhookSinkWarnsAtStart: a webhook sink without secret_env
// sends unsigned requests; New says so at WARN, naming the sink, before it
// connects anywhere.
func TestUnsignedWebhookSinkWarnsAtStart(t *testing.T) {
	file := filepath.Join(t.TempDir(), "sinks.yaml")
	yaml := "sinks:\n  - name: open_hook\n    webhook:\n      url: http://127.0.0.1:1/events\n" +
		"  - name: signed_hook\n    webhook:\n      url: http://127.0.0.1:1/events\n      secret_env: COMPENSA_TEST_SIGNED\n"
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("COMPENSA_TEST_SIGNED", "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=")
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := relay.New(ctx, relay.Config{DatabaseURL: "postgres://u@127.0.0.1:1/db?connect_timeout=1", Registry: saga.NewRegistry(), Sinks: file, Logger: logger})
	if err == nil {
		t.Fatal("New connected to nothing")
	}
	var warns []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "level=WARN") && strings.Contains(l, "unsigned") {
			warns = append(warns, l)
		}
	}
	if len(warns) != 1 || !strings.Contains(warns[0], "sink=open_hook") {
		t.Errorf("want one WARN naming open_hook, got:\n%s", logs.String())
	}
}
