package main

import (
	"bytes"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/google/uuid"
)

// captureRun runs the CLI as main does, with stdout and stderr (where the
// logs go too) captured. It swaps os.Stdout and os.Stderr, so its callers
// must not run in parallel.
func captureRun(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	oldOut, oldErr := os.Stdout, os.Stderr
	os.Stdout, os.Stderr = outW, errW
	var ob, eb bytes.Buffer
	done := make(chan struct{}, 2)
	go func() { io.Copy(&ob, outR); done <- struct{}{} }()
	go func() { io.Copy(&eb, errR); done <- struct{}{} }()
	code = run(args)
	os.Stdout, os.Stderr = oldOut, oldErr
	outW.Close()
	errW.Close()
	<-done
	<-done
	return ob.String(), eb.String(), code
}

// TestMalformedDSNNotPrinted: a malformed --database-url with a planted
// password, through every command that connects, as a flag and from the
// environment: the password is in neither stdout nor stderr (logs
// included), and the error says which part failed. Before, `relay run`
// and `relay sagas list` printed the whole DSN.
func TestMalformedDSNNotPrinted(t *testing.T) {
	for _, c := range []struct{ dsn, password, want string }{
		{"host=127.0.0.1 port=abc user=postgres password = S3cr3tPw1 dbname=x", "S3cr3tPw1", "invalid port"},
		{"postgres://postgres:S3cr3tPw4@127.0.0.1:abc/x", "S3cr3tPw4", "invalid port"},
		{"host=127.0.0.1 port=5432 password='S3cr 3tPw3' dbname=x sslmode=bogus", "S3cr 3tPw3", "sslmode"},
		{"postgres://postgres:S3cr3tPw6@127.0.0.1:5432/x?connect_timeout=soon", "S3cr3tPw6", "connect_timeout"},
		{"host=127.0.0.1 password=S3cr3tPw8 port=5432 dbname='unterminated", "S3cr3tPw8", "unterminated"},
	} {
		for _, cmd := range [][]string{
			{"run", "--log-level", "debug"}, {"sagas", "list"}, {"sagas", "show", uuid.NewString()},
			{"lag"}, {"migrate"}, {"deadletters", "list"},
		} {
			check := func(how string, stdout, stderr string, code int) {
				t.Helper()
				if code == 0 {
					t.Errorf("relay %v (%s): exit 0", cmd, how)
				}
				for _, leak := range []string{c.password, "S3cr", "3tPw"} {
					if strings.Contains(stdout, leak) || strings.Contains(stderr, leak) {
						t.Errorf("relay %v (%s) printed the password:\nstdout: %s\nstderr: %s", cmd, how, stdout, stderr)
					}
				}
				if !strings.Contains(stderr, c.want) {
					t.Errorf("relay %v (%s): the error does not say what failed (%q): %s", cmd, how, c.want, stderr)
				}
			}
			stdout, stderr, code := captureRun(t, append(append([]string{}, cmd...), "--database-url", c.dsn)...)
			check("flag", stdout, stderr, code)
			t.Setenv("RELAY_DATABASE_URL", c.dsn)
			stdout, stderr, code = captureRun(t, cmd...)
			check("env", stdout, stderr, code)
			os.Unsetenv("RELAY_DATABASE_URL")
		}
	}
}

// TestWeakTokenRefused: `relay run --api-token a` exits 2 before
// connecting, with a line that shows how to make a token, and the line is
// not mangled by masking every "a" of it (which gave the token away).
func TestWeakTokenRefused(t *testing.T) {
	for _, tok := range []string{"a", "hunter2", "0123456789abcdef"} {
		stdout, stderr, code := captureRun(t, "run", "--database-url", "postgres://u:pw@127.0.0.1:1/x", "--api-token", tok)
		if code != 2 || !strings.Contains(stderr, "openssl rand -hex 32") || !strings.Contains(stderr, "--api-token is too weak") || stdout != "" {
			t.Errorf("--api-token %q: exit %d, stderr %q", tok, code, stderr)
		}
		if strings.Contains(stderr, "xxxxx") {
			t.Errorf("--api-token %q: the message is masked: %q", tok, stderr)
		}
	}
	t.Setenv("RELAY_API_TOKEN", "a")
	if _, stderr, code := captureRun(t, "run", "--database-url", "postgres://u:pw@127.0.0.1:1/x"); code != 2 || !strings.Contains(stderr, "openssl rand -hex 32") {
		t.Errorf("RELAY_API_TOKEN=a: exit %d, %q", code, stderr)
	}
}
