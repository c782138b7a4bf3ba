package correlator

import "encoding/json"

// SkipPayloadChecks makes plan.add trust every JSON payload, so that tests can
// send PostgreSQL a value it refuses and exercise the fallback. It returns a
// function that restores the checks.
func SkipPayloadChecks() (restore func()) {
	prev := checkPayload
	checkPayload = func(p []byte) error {
		if !json.Valid(p) {
			return prev(p)
		}
		return nil
	}
	return func() { checkPayload = prev }
}

// SkipAggregateClipping makes starts keep an aggregate id of any length, so
// that tests can make PostgreSQL refuse an index entry and exercise the
// one-by-one fallback. It returns a function that restores the clipping.
func SkipAggregateClipping() (restore func()) {
	prev := aggregateLimit
	aggregateLimit = 1 << 30
	return func() { aggregateLimit = prev }
}

// GuardedBatches is how many batches stay guarded after a refused start.
const GuardedBatches = guardedBatches

// CopyStarts is the smallest number of plain starts a batch sends as COPY.
const CopyStarts = copyStarts
