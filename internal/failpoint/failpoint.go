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

// Env names a test-only fault injection: with
// RELAY_FAILPOINT=crash-after-batch:N the process SIGKILLs itself right after
// the correlator committed its N-th batch with events, before the stream can
// report that batch's LSN to PostgreSQL: the crash the replay check exists
// for. It is compiled only with `-tags failpoint`, which the test harness
// (test/relaytest) uses; a release binary ignores the variable.
const Env = "RELAY_FAILPOINT"

// Wrap wraps sink when the failpoint is set.
func Wrap(sink cdc.Sink) cdc.Sink {
	spec := os.Getenv(Env)
	n, ok := strings.CutPrefix(spec, "crash-after-batch:")
	if !ok {
		return sink
	}
	limit, err := strconv.Atoi(n)
	if err != nil || limit < 1 {
		return sink
	}
	var seen atomic.Int64
	return cdc.SinkFunc(func(ctx context.Context, b cdc.Batch) error {
		if err := sink.HandleBatch(ctx, b); err != nil {
			return err
		}
		if len(b.Events) > 0 && seen.Add(1) == int64(limit) {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way; acknowledge nothing
		}
		return nil
	})
}
