package saga

import "time"

// DelayAt exposes the backoff with the random draw fixed, for tests.
func (p RetryPolicy) DelayAt(n int, r float64) time.Duration { return p.delay(n, r) }
