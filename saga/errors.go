package saga

import (
	"errors"
	"fmt"
	"time"
)

// Error kinds a caller tests with errors.Is. Every error the journal and the
// runner return wraps exactly one of them, with a message a person can act on.
var (
	// ErrNotFound: the instance (or definition) does not exist.
	ErrNotFound = errors.New("not found")
	// ErrConflict: the write collides with existing state (a duplicate id).
	ErrConflict = errors.New("conflict")
	// ErrInvalid: the request or transition is not allowed (a bad event, an
	// illegal status change, a non-positive limit).
	ErrInvalid = errors.New("invalid")
	// ErrLeaseLost: the caller's lease is stale or was taken over; the write
	// matched no row and nothing was changed.
	ErrLeaseLost = errors.New("lease lost")
	// ErrPermanent marks a step error that must not be retried: the saga
	// compensates at once. Wrap with Permanent.
	ErrPermanent = errors.New("permanent failure")
)

// Errorf returns an error of the given kind: errors.Is(err, kind) holds and the
// message reads "<kind>: <text>".
func Errorf(kind error, format string, args ...any) error {
	return &kindError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

type kindError struct {
	kind error
	msg  string
}

func (e *kindError) Error() string { return e.kind.Error() + ": " + e.msg }
func (e *kindError) Unwrap() error { return e.kind }

// Permanent wraps err so that the runner does not retry it: the step counts as
// failed for good and the saga compensates.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string   { return e.err.Error() }
func (e *permanentError) Unwrap() []error { return []error{e.err, ErrPermanent} }

// IsPermanent reports whether err (or anything it wraps) is permanent.
func IsPermanent(err error) bool { return errors.Is(err, ErrPermanent) }

// ErrMayHaveActed marks a failed attempt whose effect may exist all the same
// (a call out that got a 5xx, or no answer): the step is compensated if the
// saga compensates, as a step that ran out of its Timeout is. Wrap with
// MayHaveActed.
var ErrMayHaveActed = errors.New("may have acted")

// MayHaveActed wraps err so that the runner records the failed attempt as
// one that may have acted (step_failed with Reason FailureMayHaveActed).
func MayHaveActed(err error) error {
	if err == nil {
		return nil
	}
	return &actedError{err: err}
}

type actedError struct{ err error }

func (e *actedError) Error() string   { return e.err.Error() }
func (e *actedError) Unwrap() []error { return []error{e.err, ErrMayHaveActed} }

// RetryAfter wraps err with the earliest time the next attempt may come (a
// service's Retry-After): the runner waits at least d, even when its policy
// would retry sooner. The deadline still cuts the wait short.
func RetryAfter(err error, d time.Duration) error {
	if err == nil || d <= 0 {
		return err
	}
	return &retryAfterError{err: err, after: d}
}

type retryAfterError struct {
	err   error
	after time.Duration
}

func (e *retryAfterError) Error() string { return e.err.Error() }
func (e *retryAfterError) Unwrap() error { return e.err }

// retryAfterOf returns the wait a RetryAfter in err asks for.
func retryAfterOf(err error) (time.Duration, bool) {
	var ra *retryAfterError
	if errors.As(err, &ra) {
		return ra.after, true
	}
	return 0, false
}
