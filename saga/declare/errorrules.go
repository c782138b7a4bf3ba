package declare

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"go.yaml.in/yaml/v3"

	"github.com/compensa/compensa/saga"
)

// ErrorRules are a step's retry_on and fail_on: the errors of its action
// and its compensation that it classifies itself, before the defaults
// (saga.Classify). Each list holds SQLSTATEs (a five-character code such as
// 23505, or a two-character class such as 23) and HTTP statuses (integers).
// retry_on holds the instance and retries it, never compensating
// (saga.NeedsOperator); fail_on is the step's own answer at once
// (saga.Permanent: the saga compensates, a compensation ends FAILED).
type ErrorRules struct {
	RetryOn, FailOn []string
}

// match says what the rules do with a SQLSTATE or an HTTP status written
// as text: "retry", "fail" or "" (the defaults decide).
func (e ErrorRules) match(code string) string {
	in := func(list []string) bool {
		for _, c := range list {
			if c == code || (len(c) == 2 && len(code) == 5 && strings.HasPrefix(code, c)) {
				return true
			}
		}
		return false
	}
	switch {
	case in(e.FailOn):
		return "fail"
	case in(e.RetryOn):
		return "retry"
	}
	return ""
}

// apply classifies err by the rule for code, or returns def when no rule
// matches.
func (e ErrorRules) apply(code string, err, def error) error {
	switch e.match(code) {
	case "fail":
		return saga.Permanent(err)
	case "retry":
		return saga.NeedsOperator(err)
	}
	return def
}

// sqlErr classifies a statement's error: the step's rules first, then the
// SQLSTATE's class (saga.SQLStateClass), with the step's own failures that
// another attempt cannot fix (bad data, a violated constraint, a statement
// PostgreSQL refuses) made permanent. An error with no SQLSTATE (the
// connection broke or could not be made) is left for the runner to
// classify.
func sqlErr(err error, rules ErrorRules) error {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		return fmt.Errorf("sql: %w", err)
	}
	e := fmt.Errorf("sql: %s (SQLSTATE %s)", pg.Message, pg.Code)
	var def error
	switch saga.SQLStateClass(pg.Code) {
	case saga.ClassOperator:
		def = saga.NeedsOperator(e)
	case saga.ClassTransient:
		def = saga.Transient(e)
	default:
		switch pg.Code[:2] {
		case "22", "23", "42":
			def = saga.Permanent(e)
		default:
			def = e
		}
	}
	return rules.apply(pg.Code, e, def)
}

// errorRules reads a step's retry_on and fail_on (their shapes are the
// schema's); a code in both lists is reported.
func (m mapping) errorRules(r *report) ErrorRules {
	var e ErrorRules
	seen := map[string]string{}
	for _, key := range []string{"retry_on", "fail_on"} {
		for _, n := range m.list(key) {
			if n.Kind != yaml.ScalarNode {
				continue
			}
			code := strings.ToUpper(n.Value)
			if n.Tag == "!!int" {
				st, err := strconv.Atoi(n.Value)
				if err != nil || st < 100 || st > 599 {
					continue // the schema reports it
				}
				code = strconv.Itoa(st)
			}
			if other, dup := seen[code]; dup {
				if other != key {
					r.add(nodeAt(n), "%s is in both retry_on and fail_on; keep it in one", code)
				}
				continue
			}
			seen[code] = key
			if key == "retry_on" {
				e.RetryOn = append(e.RetryOn, code)
			} else {
				e.FailOn = append(e.FailOn, code)
			}
		}
	}
	return e
}
