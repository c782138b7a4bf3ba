package migrations

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrPrivilege is the kind of error Apply returns when the migrating role
// lacks a privilege; the message names the privilege, the role and the
// statement that grants it. Test it with errors.Is.
var ErrPrivilege = errors.New("migrate: insufficient privilege")

type privilegeError struct {
	msg   string
	cause error
}

func (e *privilegeError) Error() string   { return e.msg }
func (e *privilegeError) Unwrap() []error { return []error{ErrPrivilege, e.cause} }

var deniedRE = regexp.MustCompile(`^permission denied for (schema|database|table|relation|sequence) (.+)$`)

// explainPrivilege turns PostgreSQL's "permission denied" (SQLSTATE 42501)
// into a message that says which role lacks what, and the GRANT that fixes
// it. Other errors come back as they are.
func explainPrivilege(role string, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		return err
	}
	r := pgx.Identifier{role}.Sanitize()
	msg := pgErr.Message
	var what string
	if m := deniedRE.FindStringSubmatch(msg); m != nil {
		obj := m[2]
		switch m[1] {
		case "schema":
			what = fmt.Sprintf("role %q lacks CREATE on schema %s, which `relay migrate` needs to create the relay's tables (%s): run `relay migrate` as the schema's owner, or grant it as the owner or a superuser: GRANT CREATE ON SCHEMA %s TO %s;",
				role, obj, msg, obj, r)
		case "database":
			what = fmt.Sprintf("role %q lacks CREATE on database %s (%s): GRANT CREATE ON DATABASE %s TO %s; as its owner or a superuser",
				role, obj, msg, obj, r)
		default:
			what = fmt.Sprintf("role %q may not use %s %s (%s): run `relay migrate` as the role that owns the relay's tables (the one that ran it first), or GRANT ALL ON %s TO %s;",
				role, m[1], obj, msg, obj, r)
		}
	} else if obj, ok := strings.CutPrefix(msg, "must be owner of "); ok {
		kind, name, _ := strings.Cut(obj, " ")
		what = fmt.Sprintf("role %q does not own %s (%s): run `relay migrate` as its owner (the role that ran it first), or, as a superuser, ALTER %s %s OWNER TO %s;",
			role, obj, msg, strings.ToUpper(kind), name, r)
	} else {
		what = fmt.Sprintf("role %q lacks a privilege `relay migrate` needs: %s; run it as the schema's owner", role, msg)
	}
	return &privilegeError{msg: what, cause: err}
}
