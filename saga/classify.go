package saga

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrorClass says what a failed attempt means for the saga. The runner
// classifies every error a step or a compensation returns before it decides
// the instance's fate (Classify).
type ErrorClass string

const (
	// ClassStep: the step's own answer (a constraint, a data error, a
	// refusal, a 4xx, or a 5xx that outlasts the retries). It counts as an
	// attempt; once MaxAttempts are spent (at once for a Permanent error)
	// the saga compensates, or a compensation gives up and the instance
	// ends FAILED.
	ClassStep ErrorClass = "step"
	// ClassOperator: something an operator or the database must fix (a
	// missing privilege, table, column or function, a connection or
	// authentication failure, a database that is shutting down or out of
	// resources, a participant that is not listening). It never counts as
	// an attempt and never compensates: the step is retried with its capped
	// backoff for as long as it takes, and the instance shows as held with
	// the error once it has waited longer than the relay's hold-after.
	ClassOperator ErrorClass = "operator"
	// ClassTransient: a conflict with concurrent work that the next attempt
	// resolves (a serialization failure, a deadlock, a lock timeout). It is
	// retried without counting as an attempt; if it lasts, the instance
	// shows as held like ClassOperator.
	ClassTransient ErrorClass = "transient"
)

// holds reports whether an error of class c holds the instance (retries
// that never count) instead of counting as an attempt.
func (c ErrorClass) holds() bool { return c == ClassOperator || c == ClassTransient }

// ErrNeedsOperator marks an error that an operator must fix: the runner
// holds the instance and retries, and never compensates because of it.
// Wrap with NeedsOperator.
var ErrNeedsOperator = errors.New("needs an operator")

// NeedsOperator wraps err so that the runner classifies it ClassOperator,
// whatever it wraps: for a Go step, the way to say "this is a configuration
// problem, not the business's answer".
func NeedsOperator(err error) error {
	if err == nil {
		return nil
	}
	return &classedError{err: err, mark: ErrNeedsOperator}
}

// ErrTransient marks an error the next attempt resolves: retried without
// counting as an attempt. Wrap with Transient.
var ErrTransient = errors.New("transient")

// Transient wraps err so that the runner classifies it ClassTransient.
func Transient(err error) error {
	if err == nil {
		return nil
	}
	return &classedError{err: err, mark: ErrTransient}
}

type classedError struct{ err, mark error }

func (e *classedError) Error() string   { return e.err.Error() }
func (e *classedError) Unwrap() []error { return []error{e.err, e.mark} }

// Classify returns the class of a step's or a compensation's error. The
// markers a step sets win, in this order: NeedsOperator, Transient,
// Permanent (ClassStep). Otherwise a PostgreSQL error goes by its SQLSTATE
// (SQLStateClass), a failure to reach a server at all (a refused or
// unreachable connection, a name that does not resolve, a TLS handshake or
// certificate failure) is ClassOperator, and anything else is ClassStep.
func Classify(err error) ErrorClass {
	switch {
	case err == nil:
		return ClassStep
	case errors.Is(err, ErrNeedsOperator):
		return ClassOperator
	case errors.Is(err, ErrTransient):
		return ClassTransient
	case IsPermanent(err):
		return ClassStep
	}
	if pg := (*pgconn.PgError)(nil); errors.As(err, &pg) {
		return SQLStateClass(pg.Code)
	}
	if Unreachable(err) {
		return ClassOperator
	}
	return ClassStep
}

// SQLStateClass classifies a PostgreSQL error code. ClassOperator: classes
// 08 (connection), 28 (authorization), 3D (no such database), 3F (no such
// schema), 53 (insufficient resources), 57 (operator intervention, but for
// 57014, a cancelled statement: the step's own timeout), and 42501
// (insufficient privilege), 42P01 (undefined table), 42703 (undefined
// column), 42883 (undefined function). ClassTransient: 40001
// (serialization failure), 40P01 (deadlock), 55P03 (lock not available).
// Everything else is ClassStep.
func SQLStateClass(code string) ErrorClass {
	switch code {
	case "42501", "42P01", "42703", "42883":
		return ClassOperator
	case "40001", "40P01", "55P03":
		return ClassTransient
	case "57014":
		return ClassStep
	}
	if len(code) == 5 {
		switch code[:2] {
		case "08", "28", "3D", "3F", "53", "57":
			return ClassOperator
		}
	}
	return ClassStep
}

// Unreachable reports whether err is a failure to reach a server before
// anything was sent: a refused or unreachable connection, a dial that timed
// out, a name that does not resolve, a TLS handshake or certificate error,
// or pgx's failure to connect.
func Unreachable(err error) bool {
	var connect *pgconn.ConnectError
	if errors.As(err, &connect) {
		return true
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return true
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) {
		return true
	}
	var (
		unknownCA *x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		verify    *tls.CertificateVerificationError
		record    tls.RecordHeaderError
		alert     tls.AlertError
	)
	return errors.As(err, &unknownCA) || errors.As(err, &hostname) || errors.As(err, &invalid) ||
		errors.As(err, &verify) || errors.As(err, &record) || errors.As(err, &alert)
}

// heldDelay is the wait before the next attempt of an instance held since
// since (nil: held from now): as long as it has been held, between the
// policy's Base and Max, with its jitter, so that the attempts thin out the
// longer the cause lasts without ever stopping.
func heldDelay(pol RetryPolicy, since *time.Time, now time.Time) time.Duration {
	held := time.Duration(0)
	if since != nil {
		held = now.Sub(*since)
	}
	d := min(max(held, pol.Base), pol.Max)
	return pol.withJitter(d)
}
