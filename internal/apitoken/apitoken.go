// Package apitoken is the monitor's token model: who may call /v1, on which
// tenant's instances, and whether they may act or only read.
//
// It promises:
//
//   - A token file (`--api-tokens FILE`) is validated as a whole: every
//     problem is reported at once as `file:line:col: what; how to fix`, and
//     a file with any problem yields no Set at all.
//   - Tokens are held as SHA-256 digests only and compared in constant time
//     against every configured digest (no early exit, no length leak), so
//     the time to answer says nothing about which token came close.
//   - A Token's String and the errors never contain a secret: a token is
//     named by its Name, the name the journal records as the caller.
//   - Tenant "*" (Tenant.Valid false) sees every tenant; any other token is
//     scoped to its one tenant whatever the request says.
package apitoken

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"

	"github.com/google/uuid"
)

// Role says what a token may do.
type Role string

const (
	// RoleOperate reads and retries or cancels.
	RoleOperate Role = "operate"
	// RoleRead only reads.
	RoleRead Role = "read"
)

// CanMutate reports whether the role may retry and cancel.
func (r Role) CanMutate() bool { return r == RoleOperate }

// Token is one configured caller.
type Token struct {
	// Name identifies the caller in the journal and the logs.
	Name string
	// Digest is the SHA-256 of the token.
	Digest [sha256.Size]byte
	// Tenant scopes the token; not Valid means every tenant ("*").
	Tenant uuid.NullUUID
	Role   Role
}

// String names the token without its secret.
func (t Token) String() string {
	tenant := "*"
	if t.Tenant.Valid {
		tenant = t.Tenant.UUID.String()
	}
	return fmt.Sprintf("%s (tenant %s, %s)", t.Name, tenant, t.Role)
}

// Set is the configured tokens. The zero Set (or nil) holds none.
type Set struct {
	tokens []Token
}

// SingleName is the name of the token given by --api-token.
const SingleName = "api-token"

// Single is the Set of --api-token: one token for every tenant that may
// operate, named SingleName.
func Single(token string) *Set {
	return &Set{tokens: []Token{{Name: SingleName, Digest: sha256.Sum256([]byte(token)), Role: RoleOperate}}}
}

// Join returns a Set holding the tokens of both (either may be nil). Two
// tokens with the same name or the same secret are an error: the journal
// could not tell the callers apart.
func Join(a, b *Set) (*Set, error) {
	out := &Set{}
	names := map[string]bool{}
	digests := map[[sha256.Size]byte]string{}
	for _, s := range []*Set{a, b} {
		for _, t := range s.Tokens() {
			if names[t.Name] {
				return nil, fmt.Errorf("two tokens are named %q: give each caller its own name", t.Name)
			}
			if other, dup := digests[t.Digest]; dup {
				return nil, fmt.Errorf("tokens %q and %q are the same secret: give each caller its own token", other, t.Name)
			}
			names[t.Name], digests[t.Digest] = true, t.Name
			out.tokens = append(out.tokens, t)
		}
	}
	return out, nil
}

// Len is the number of tokens.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.tokens)
}

// Tokens returns a copy of the tokens.
func (s *Set) Tokens() []Token {
	if s == nil {
		return nil
	}
	return append([]Token(nil), s.tokens...)
}

// Match finds the token whose secret is given. Every configured digest is
// compared, in constant time, whatever matches first.
func (s *Set) Match(given string) (Token, bool) {
	if s.Len() == 0 {
		return Token{}, false
	}
	g := sha256.Sum256([]byte(given))
	found := -1
	for i := range s.tokens {
		if subtle.ConstantTimeCompare(g[:], s.tokens[i].Digest[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return Token{}, false
	}
	return s.tokens[found], true
}
