package cdc

import "time"

// CrashOnStop makes the stream's next stop behave like a killed process: the
// batch in flight is abandoned, no final status update is sent and the
// connections are cut without a goodbye.
func CrashOnStop(s *Stream) { s.hardStop.Store(true) }

// SetCatchUpWait sets how long a batch waits for more while the stream
// catches up; call it before Run.
func SetCatchUpWait(s *Stream, d time.Duration) { s.catchUpWait = d }
