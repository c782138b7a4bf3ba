package apitoken

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"

	"github.com/google/uuid"
	"go.yaml.in/yaml/v3"
)

// Problem is one thing wrong in a token file, at a position.
type Problem struct {
	File      string
	Line, Col int
	// Msg says what is wrong and how to fix it.
	Msg string
}

func (p Problem) Error() string {
	return fmt.Sprintf("%s:%d:%d: %s", p.File, p.Line, p.Col, p.Msg)
}

// Problems is every problem of a file, in the order of the file.
type Problems []Problem

func (ps Problems) Error() string {
	lines := make([]string, len(ps))
	for i, p := range ps {
		lines[i] = p.Error()
	}
	return strings.Join(lines, "\n")
}

// Check judges a secret read from token_env (e.g. its strength); what
// names it for the message. Its error becomes a problem at that entry.
type Check func(what, secret string) error

// Load reads and validates a token file. getenv resolves token_env (nil:
// os.Getenv); checks judge every secret read that way. Any problem →
// Problems, listing all of them.
func Load(path string, getenv func(string) string, checks ...Check) (*Set, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--api-tokens: %w", err)
	}
	return Parse(path, data, getenv, checks...)
}

var (
	namePattern   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:@-]{0,63}$`)
	envPattern    = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	digestPattern = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)
)

// Fields of one token entry, in the order the docs and the schema list them.
var tokenFields = []string{"name", "token_env", "sha256", "tenant", "role"}

// Parse validates a token file's content; file names it in the problems.
func Parse(file string, data []byte, getenv func(string) string, checks ...Check) (*Set, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	p := &parser{file: file, checks: checks}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		line, col := 1, 1
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			// yaml.v3 reports "yaml: line N: ..."; keep its text.
			fmt.Sscanf(strings.TrimPrefix(err.Error(), "yaml: "), "line %d:", &line)
		}
		msg := strings.TrimPrefix(err.Error(), "yaml: ")
		if err.Error() == "EOF" {
			msg = "the file is empty; it needs a `tokens:` list (see docs/monitor.md, \"API tokens\")"
		}
		return nil, Problems{{File: file, Line: line, Col: col, Msg: msg + "; fix the YAML syntax"}}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		p.add(&extra, "a second YAML document; a token file holds one document")
	}
	set := p.document(&doc, getenv)
	if len(p.problems) > 0 {
		return nil, p.problems
	}
	return set, nil
}

type parser struct {
	file     string
	checks   []Check
	problems Problems
}

func (p *parser) add(n *yaml.Node, format string, args ...any) {
	p.problems = append(p.problems, Problem{File: p.file, Line: n.Line, Col: n.Column, Msg: fmt.Sprintf(format, args...)})
}

func (p *parser) document(doc *yaml.Node, getenv func(string) string) *Set {
	root := doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind != yaml.MappingNode {
		p.add(root, "the file must be a mapping with a `tokens:` list")
		return nil
	}
	var list *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Value == "tokens" {
			list = v
			continue
		}
		p.add(k, "unknown key %q; the file's only key is `tokens`", k.Value)
	}
	if list == nil {
		p.add(root, "no `tokens:` list; add one entry per caller (name, token_env or sha256, tenant, role)")
		return nil
	}
	if list.Kind != yaml.SequenceNode || len(list.Content) == 0 {
		p.add(list, "`tokens` must be a non-empty list of entries (name, token_env or sha256, tenant, role)")
		return nil
	}
	set := &Set{}
	names := map[string]*yaml.Node{}
	digests := map[[sha256.Size]byte]string{}
	for _, entry := range list.Content {
		t, ok := p.token(entry, getenv)
		if !ok {
			continue
		}
		if first, dup := names[t.Name]; dup {
			p.add(entry, "name %q is already used at line %d; give each caller its own name (the journal records it)", t.Name, first.Line)
			continue
		}
		names[t.Name] = entry
		if other, dup := digests[t.Digest]; dup {
			p.add(entry, "token %q has the same secret as %q; give each caller its own token", t.Name, other)
			continue
		}
		digests[t.Digest] = t.Name
		set.tokens = append(set.tokens, t)
	}
	return set
}

// token validates one entry; ok is false when it has a problem.
func (p *parser) token(n *yaml.Node, getenv func(string) string) (Token, bool) {
	before := len(p.problems)
	var t Token
	if n.Kind != yaml.MappingNode {
		p.add(n, "a token entry must be a mapping with name, token_env or sha256, tenant and role")
		return t, false
	}
	fields := map[string]*yaml.Node{}
	keys := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if !known(k.Value) {
			p.add(k, "unknown key %q; a token entry has %s", k.Value, strings.Join(tokenFields, ", "))
			continue
		}
		if _, dup := fields[k.Value]; dup {
			p.add(k, "%q is given twice; keep one", k.Value)
			continue
		}
		if v.Kind != yaml.ScalarNode {
			p.add(v, "%q must be a single value", k.Value)
			continue
		}
		fields[k.Value], keys[k.Value] = v, k
	}

	if v, ok := fields["name"]; !ok {
		p.add(n, "missing `name`; name the caller (it is what the journal records), e.g. acme-ops")
	} else if !namePattern.MatchString(v.Value) {
		p.add(v, "name %q must be 1 to 64 letters, digits or . _ : @ -, starting with a letter or digit", v.Value)
	} else {
		t.Name = v.Value
	}

	env, hasEnv := fields["token_env"]
	dig, hasDig := fields["sha256"]
	switch {
	case hasEnv && hasDig:
		p.add(keys["sha256"], "give either token_env or sha256, not both")
	case !hasEnv && !hasDig:
		p.add(n, "missing the secret: add `token_env: VAR` (the token is read from that environment variable) or `sha256: <hex digest of the token>`")
	case hasEnv:
		switch {
		case !envPattern.MatchString(env.Value):
			// The value is not echoed: a token pasted here by mistake must
			// not reach the terminal or a log.
			p.add(env, "token_env is not an environment variable name (letters, digits, _): name the variable that holds the token, not the token itself")
		case getenv(env.Value) == "":
			p.add(env, "environment variable %s is not set or empty; export it with the token before starting the relay", env.Value)
		default:
			secret := getenv(env.Value)
			ok := true
			for _, check := range p.checks {
				if err := check("the token in "+env.Value, secret); err != nil {
					p.add(env, "%v", err)
					ok = false
					break
				}
			}
			if ok {
				t.Digest = sha256.Sum256([]byte(secret))
			}
		}
	case hasDig:
		if !digestPattern.MatchString(dig.Value) {
			p.add(dig, "sha256 must be 64 hex digits (the SHA-256 of the token, e.g. printf %%s \"$TOKEN\" | sha256sum)")
		} else {
			b, _ := hex.DecodeString(dig.Value)
			copy(t.Digest[:], b)
		}
	}

	if v, ok := fields["tenant"]; !ok {
		p.add(n, "missing `tenant`; give the tenant's UUID, or \"*\" for every tenant")
	} else if v.Value != "*" {
		id, err := uuid.Parse(v.Value)
		if err != nil || len(v.Value) != 36 {
			p.add(v, "tenant %q is not a UUID; give the tenant's UUID, or \"*\" for every tenant", v.Value)
		} else {
			t.Tenant = uuid.NullUUID{UUID: id, Valid: true}
		}
	}

	if v, ok := fields["role"]; !ok {
		p.add(n, "missing `role`; operate (read, retry, cancel) or read")
	} else if r := Role(v.Value); r != RoleOperate && r != RoleRead {
		p.add(v, "role %q is not operate or read", v.Value)
	} else {
		t.Role = r
	}
	return t, len(p.problems) == before
}

func known(k string) bool {
	i := sort.SearchStrings(sortedFields, k)
	return i < len(sortedFields) && sortedFields[i] == k
}

var sortedFields = func() []string {
	s := append([]string(nil), tokenFields...)
	sort.Strings(s)
	return s
}()
