//go:build failpoint

package failpoint

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/compensa/compensa/cdc"
)

// Env names a test-only fault injection. With
// RELAY_FAILPOINT=crash-after-batch:N the process SIGKILLs itself right after
// the correlator committed its N-th batch with events, before the stream can
// report that batch's LSN to PostgreSQL: the crash the replay check exists
// for. With RELAY_FAILPOINT=crash-before-snapshot-batch:N it SIGKILLs itself
// when the N-th batch of rows read from the outbox table (a first start's
// snapshot, a resync's re-read) with events arrives, before the correlator
// sees it: a crash in the middle of a re-read. It is compiled only with
// `-tags failpoint`, which the test harness (test/relaytest) uses; a release
// binary ignores the variable.
const Env = "RELAY_FAILPOINT"

// Wrap wraps sink when the failpoint is set.
func Wrap(sink cdc.Sink) cdc.Sink {
	spec := os.Getenv(Env)
	name, n, _ := strings.Cut(spec, ":")
	limit, err := strconv.Atoi(n)
	if err != nil || limit < 1 {
		return sink
	}
	var seen atomic.Int64
	switch name {
	case "crash-after-batch":
		return cdc.SinkFunc(func(ctx context.Context, b cdc.Batch) error {
			if err := sink.HandleBatch(ctx, b); err != nil {
				return err
			}
			if len(b.Events) > 0 && seen.Add(1) == int64(limit) {
				crash()
			}
			return nil
		})
	case "crash-before-snapshot-batch":
		return cdc.SinkFunc(func(ctx context.Context, b cdc.Batch) error {
			if b.Snapshot && len(b.Events) > 0 && seen.Add(1) == int64(limit) {
				crash()
			}
			return sink.HandleBatch(ctx, b)
		})
	}
	return sink
}

// crash SIGKILLs the process and never returns.
func crash() {
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way; acknowledge nothing
}
