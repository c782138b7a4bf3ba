package relay_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
