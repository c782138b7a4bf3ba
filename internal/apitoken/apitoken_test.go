package apitoken_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/compensa/compensa/internal/apitoken"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func digest(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }

func TestParseValidFile(t *testing.T) {
	t.Parallel()
	file := `tokens:
  - name: acme-ops
    token_env: ACME_OPS_TOKEN
    tenant: 3f0c2a9e-5b1d-4c6e-8f7a-9b0c1d2e3f40
    role: operate
  - name: dashboards
    sha256: ` + digest("read-everything-token") + `
    tenant: "*"
    role: read
`
	set, err := apitoken.Parse("tokens.yaml", []byte(file), env(map[string]string{"ACME_OPS_TOKEN": "acme-secret-token"}))
	if err != nil {
		t.Fatal(err)
	}
	if set.Len() != 2 {
		t.Fatalf("%d tokens, want 2", set.Len())
	}
	tok, ok := set.Match("acme-secret-token")
	if !ok || tok.Name != "acme-ops" || !tok.Tenant.Valid || tok.Tenant.UUID.String() != "3f0c2a9e-5b1d-4c6e-8f7a-9b0c1d2e3f40" || !tok.Role.CanMutate() {
		t.Fatalf("acme token: %v %v", tok, ok)
	}
	tok, ok = set.Match("read-everything-token")
	if !ok || tok.Name != "dashboards" || tok.Tenant.Valid || tok.Role.CanMutate() {
		t.Fatalf("dashboards token: %v %v", tok, ok)
	}
	for _, wrong := range []string{"", "acme-secret-toke", "acme-secret-token ", digest("read-everything-token")} {
		if tok, ok := set.Match(wrong); ok {
			t.Errorf("%q matched %v", wrong, tok)
		}
	}
	if s := tok.String(); strings.Contains(s, "read-everything-token") {
		t.Errorf("String shows the secret: %s", s)
	}
}

// TestParseReportsEveryProblemAtOnce: one file, many mistakes; each is
// reported with its line and column, and no Set comes back.
func TestParseReportsEveryProblemAtOnce(t *testing.T) {
	t.Parallel()
	file := `tokens:
  - name: acme-ops
    token_env: UNSET_VAR
    tenant: not-a-uuid
    role: admin
  - name: acme-ops
    sha256: 1234
    tenant: "*"
    role: read
    colour: blue
  - token_env: A
    sha256: ` + digest("x") + `
    tenant: "*"
    role: read
  - name: "bad name!"
    tenant: "*"
    role: read
`
	_, err := apitoken.Parse("t.yaml", []byte(file), env(map[string]string{"A": "a"}))
	var ps apitoken.Problems
	if !errors.As(err, &ps) {
		t.Fatalf("error %v is not Problems", err)
	}
	want := []string{
		`t.yaml:3:16: environment variable UNSET_VAR is not set or empty`,
		`t.yaml:4:13: tenant "not-a-uuid" is not a UUID`,
		`t.yaml:5:11: role "admin" is not operate or read`,
		`t.yaml:10:5: unknown key "colour"`,
		`t.yaml:7:13: sha256 must be 64 hex digits`,
		`t.yaml:11:5: missing ` + "`name`",
		`t.yaml:12:5: give either token_env or sha256, not both`,
		`t.yaml:15:11: name "bad name!" must be`,
		`t.yaml:15:5: missing the secret`,
	}
	got := err.Error()
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("missing %q in:\n%s", w, got)
		}
	}
	if len(ps) != len(want) {
		t.Errorf("%d problems, want %d:\n%s", len(ps), len(want), got)
	}
}

func TestParseDuplicates(t *testing.T) {
	t.Parallel()
	file := `tokens:
  - {name: a, token_env: T1, tenant: "*", role: read}
  - {name: a, token_env: T2, tenant: "*", role: read}
  - {name: b, token_env: T3, tenant: "*", role: read}
`
	_, err := apitoken.Parse("d.yaml", []byte(file), env(map[string]string{"T1": "one", "T2": "two", "T3": "one"}))
	if err == nil || !strings.Contains(err.Error(), `d.yaml:3:5: name "a" is already used at line 2`) ||
		!strings.Contains(err.Error(), `d.yaml:4:5: token "b" has the same secret as "a"`) {
		t.Fatalf("duplicates: %v", err)
	}
	if strings.Contains(err.Error(), "one") && strings.Contains(err.Error(), `"one"`) {
		t.Fatalf("the error shows a secret: %v", err)
	}
}

func TestParseShapes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ file, want string }{
		{"", "f:1:1: the file is empty"},
		{"tokens: [", "f:1:1:"},
		{"- a", "f:1:1: the file must be a mapping"},
		{"tokenz: []", `f:1:1: unknown key "tokenz"`},
		{"tokens: []", "f:1:9: `tokens` must be a non-empty list"},
		{"tokens:\n  - 3", "f:2:5: a token entry must be a mapping"},
		{"tokens:\n  - {name: a, token_env: T, tenant: '*', role: read}\n---\nx: 1", "a second YAML document"},
	} {
		_, err := apitoken.Parse("f", []byte(c.file), env(map[string]string{"T": "t"}))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.file, err, c.want)
		}
	}
}

func TestSingleAndJoin(t *testing.T) {
	t.Parallel()
	s := apitoken.Single("the-one-token")
	tok, ok := s.Match("the-one-token")
	if !ok || tok.Name != apitoken.SingleName || tok.Tenant.Valid || tok.Role != apitoken.RoleOperate {
		t.Fatalf("single: %v %v", tok, ok)
	}
	if _, err := apitoken.Join(s, apitoken.Single("the-one-token")); err == nil {
		t.Fatal("joining two tokens named api-token worked")
	}
	f, err := apitoken.Parse("f", []byte("tokens:\n  - {name: x, token_env: T, tenant: '*', role: read}"), env(map[string]string{"T": "the-one-token"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := apitoken.Join(s, f); err == nil || !strings.Contains(err.Error(), "same secret") {
		t.Fatalf("join with the same secret: %v", err)
	}
	var none *apitoken.Set
	if none.Len() != 0 {
		t.Fatal("nil set has tokens")
	}
	if _, ok := none.Match(""); ok {
		t.Fatal("nil set matched")
	}
}

// TestSchemaMatchesTheLoader: the published JSON Schema names exactly the
// keys the loader accepts, with the same required ones.
func TestSchemaMatchesTheLoader(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("api-tokens.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		Properties struct {
			Tokens struct {
				Items struct {
					Properties map[string]any `json:"properties"`
					Required   []string       `json:"required"`
				} `json:"items"`
			} `json:"tokens"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range s.Properties.Tokens.Items.Properties {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	want := []string{"name", "role", "sha256", "tenant", "token_env"}
	if !slices.Equal(keys, want) {
		t.Errorf("schema keys %v, want %v", keys, want)
	}
	req := s.Properties.Tokens.Items.Required
	slices.Sort(req)
	if !slices.Equal(req, []string{"name", "role", "tenant"}) {
		t.Errorf("schema requires %v", req)
	}
}

var position = regexp.MustCompile(`^f:\d+:\d+: `)

func FuzzParse(f *testing.F) {
	f.Add("tokens:\n  - {name: a, token_env: T, tenant: '*', role: read}")
	f.Add("tokens:\n  - name: a\n    sha256: " + digest("x") + "\n    tenant: 3f0c2a9e-5b1d-4c6e-8f7a-9b0c1d2e3f40\n    role: operate\n")
	f.Add("tokens: [1, {}, [], {name: {}}]")
	f.Fuzz(func(t *testing.T, file string) {
		set, err := apitoken.Parse("f", []byte(file), env(map[string]string{"T": "secret-value"}))
		if err != nil {
			if set != nil {
				t.Fatal("a Set came back with an error")
			}
			for _, line := range strings.Split(err.Error(), "\n") {
				if !position.MatchString(line) {
					t.Fatalf("problem without a position: %q", line)
				}
			}
			if strings.Contains(err.Error(), "secret-value") {
				t.Fatal("the error shows a secret")
			}
			return
		}
		if set.Len() == 0 {
			t.Fatal("no error and no token")
		}
	})
}

func TestParseChecksSecrets(t *testing.T) {
	t.Parallel()
	weak := func(what, secret string) error {
		if len(secret) < 10 {
			return errors.New(what + " is too weak")
		}
		return nil
	}
	_, err := apitoken.Parse("w.yaml", []byte("tokens:\n  - {name: a, token_env: SHORT, tenant: '*', role: read}\n"), env(map[string]string{"SHORT": "abc"}), weak)
	if err == nil || !strings.Contains(err.Error(), "w.yaml:2:26: the token in SHORT is too weak") || strings.Contains(err.Error(), "abc") {
		t.Fatalf("weak token: %v", err)
	}
}
