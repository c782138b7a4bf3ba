package dbconn

import (
	"context"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// malformedDSNs each hold a planted password and one mistake; want is a
// word the message must hold to say which part failed.
var malformedDSNs = []struct{ dsn, password, want string }{
	// The probe's case: spaces around "=" are valid, the port is not.
	{"host=127.0.0.1 port=abc user=postgres password = S3cr3tPw1 dbname=x", "S3cr3tPw1", "port"},
	{"host=127.0.0.1 port=abc user=postgres password=S3cr3tPw2 dbname=x", "S3cr3tPw2", "port"},
	{"host=127.0.0.1 port=5432 password='S3cr 3tPw3' dbname=x sslmode=bogus", "S3cr 3tPw3", "sslmode"},
	{"postgres://postgres:S3cr3tPw4@127.0.0.1:abc/x", "S3cr3tPw4", "port"},
	{"postgres://postgres:S3cr3tPw5@127.0.0.1:5432/x?sslmode=bogus", "S3cr3tPw5", "sslmode"},
	{"postgres://postgres:S3cr3tPw6@127.0.0.1:5432/x?connect_timeout=soon", "S3cr3tPw6", "connect_timeout"},
	{"postgresql://postgres:S3c%zzr3tPw7@127.0.0.1/x", "S3c%zzr3tPw7", "password"},
	{"host=127.0.0.1 password=S3cr3tPw8 port=5432 dbname='unterminated", "S3cr3tPw8", "unterminated"},
	{"postgres://u:S3cr3tPw9@[::1/x", "S3cr3tPw9", "URL"},
	{"password = S3cr3tPwA target_session_attrs=bogus", "S3cr3tPwA", "target_session_attrs"},
	{"postgres://u@h/x?password=S3cr3tPwB&port=abc", "S3cr3tPwB", "port"},
	{"host=a,b port=1,2,3 password=S3cr3tPwC", "S3cr3tPwC", "port"},
}

// TestMalformedDSNNeverEchoed: before, the parse error quoted the DSN
// through the driver's best-effort redaction, which left "password =
// S3cr3tPw" whole.
func TestMalformedDSNNeverEchoed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, c := range malformedDSNs {
		_, perr := OpenPool(ctx, c.dsn, 1)
		_, cerr := Connect(ctx, c.dsn)
		for _, err := range []error{perr, cerr} {
			if err == nil {
				t.Fatalf("%q parsed", c.dsn)
			}
			msg := err.Error()
			for _, leak := range []string{c.password, "S3cr", "3tPw"} {
				if strings.Contains(msg, leak) {
					t.Errorf("%q: the message shows the password: %s", c.dsn, msg)
				}
			}
			if !strings.Contains(msg, c.want) || !strings.Contains(msg, "--database-url") {
				t.Errorf("%q: the message does not say what failed (%q): %s", c.dsn, c.want, msg)
			}
		}
		if ps := Passwords(c.dsn); !contains(ps, c.password) {
			t.Errorf("Passwords(%q) = %q: the planted password is not found, so logs would not be scrubbed of it", c.dsn, ps)
		}
	}
}

// TestRedactWholeWordsOnly: a one-letter secret is masked where it stands
// alone, never inside words, which used to give it away.
func TestRedactWholeWordsOnly(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, secret, want string }{
		{"relay started", "a", "relay started"},
		{"password=a dbname=x", "a", "password=xxxxx dbname=x"},
		{"postgres://u:a@h/x", "a", "postgres://u:xxxxx@h/x"},
		{"token hunter2 refused", "hunter2", "token xxxxx refused"},
		{"hunter22 is not it", "hunter2", "hunter22 is not it"},
		{"p@ss! and xp@ss!", "p@ss!", "xxxxx and xp@ss!"},
		{"-pw-x", "-pw-", "xxxxxx"},
		{"aaa", "aa", "aaa"},
	} {
		if got := RedactAll(c.in, []string{c.secret}); got != c.want {
			t.Errorf("RedactAll(%q, %q) = %q, want %q", c.in, c.secret, got, c.want)
		}
	}
}

// FuzzRedactAll: after redaction the secret never stands as a whole word,
// and text without the secret is unchanged.
func FuzzRedactAll(f *testing.F) {
	f.Add("password=a dbname=x", "a")
	f.Add("relay started", "a")
	f.Add("postgres://u:p%40ss@h/x", "p@ss")
	f.Add("aaaa", "aa")
	f.Fuzz(func(t *testing.T, s, secret string) {
		if secret == "" {
			return
		}
		got := RedactAll(s, []string{secret})
		if !strings.Contains(s, secret) && got == s {
			return
		}
		if replaceWhole(got, secret, "\x00") != got && !strings.Contains(secret, "xxxxx") && !strings.Contains("xxxxx", secret) {
			t.Fatalf("RedactAll(%q, %q) = %q: a whole occurrence is left", s, secret, got)
		}
	})
}
