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

// RetryAfterOf returns the wait a RetryAfter in err asks for.
func RetryAfterOf(err error) (time.Duration, bool) {
	var ra *retryAfterError
	if errors.As(err, &ra) {
		return ra.after, true
	}
	return 0, false
}

// ErrSkipped marks a step that decided not to act (a declared step whose
// when is false): the runner journals step_skipped instead of a failure,
// the saga goes on with the next step, and the skipped step is never
// compensated. Whatever Do wrote is rolled back. Return it with Skip.
var ErrSkipped = errors.New("step skipped")

// Skip returns the error a step's Do returns to be skipped, with the reason
// the journal records.
func Skip(reason string) error { return &skipError{reason: reason} }

type skipError struct{ reason string }

func (e *skipError) Error() string { return "step skipped: " + e.reason }
func (e *skipError) Unwrap() error { return ErrSkipped }

// skipReason is the reason a Skip in err gives.
func skipReason(err error) string {
	var se *skipError
	if errors.As(err, &se) {
		return se.reason
	}
	return err.Error()
}

// WaitUntil returns the error a step's Do returns to wait until t before
// the saga goes on (a timer): the runner journals step_waiting with t and
// sets the instance due at t (or at the saga's deadline, when sooner); no
// worker is held meanwhile and no attempt is counted. When the wait is
// over the step completes without Do running again. Whatever Do wrote is
// rolled back. A t that has passed completes the step at once.
func WaitUntil(t time.Time) error { return &waitError{until: t} }

type waitError struct{ until time.Time }

func (e *waitError) Error() string {
	return "step waits until " + e.until.UTC().Format(time.RFC3339Nano)
}

// waitOf returns the end of the wait a WaitUntil in err asks for.
func waitOf(err error) (time.Time, bool) {
	var we *waitError
	if errors.As(err, &we) {
		return we.until, true
	}
	return time.Time{}, false
}
