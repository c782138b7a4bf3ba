package saga

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// connectListener opens a connection of its own (not from the pool: a
// LISTEN belongs to one session for its whole life) and listens on the wake
// channel.
func (r *Runner) connectListener(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, r.pool.Config().ConnConfig.Copy())
	if err != nil {
		return nil, fmt.Errorf("saga runner: connect for LISTEN %s: %w", r.cfg.WakeChannel, err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{r.cfg.WakeChannel}.Sanitize()); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("saga runner: LISTEN %s: %w", r.cfg.WakeChannel, err)
	}
	return conn, nil
}

// listen turns notifications into wake-ups until Stop. A lost connection is
// re-opened with a capped backoff; on reconnection the runner is woken once,
// since notifications sent meanwhile were lost.
func (r *Runner) listen(conn *pgx.Conn) {
	defer r.wg.Done()
	ctx, cancel := context.WithCancel(r.baseCtx)
	defer cancel()
	go func() {
		select {
		case <-r.stopping:
			cancel()
		case <-ctx.Done():
		}
	}()
	closeConn := func() {
		if conn != nil {
			cctx, ccancel := context.WithTimeout(r.baseCtx, time.Second)
			conn.Close(cctx)
			ccancel()
			conn = nil
		}
	}
	defer closeConn()
	backoff := RetryPolicy{Base: 100 * time.Millisecond, Factor: 2, Max: 10 * time.Second, Jitter: 0.2}
	failures := 0
	for {
		if conn == nil {
			c, err := r.connectListener(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				failures++
				r.throttle.Warn("listen", "saga runner: LISTEN connection failed, polling meanwhile", "err", err)
				t := time.NewTimer(backoff.Delay(failures))
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-t.C:
				}
				continue
			}
			conn, failures = c, 0
			r.throttle.Recovered("listen", "saga runner: LISTEN connection restored")
			r.Wake()
		}
		_, err := conn.WaitForNotification(ctx)
		if err == nil {
			r.Wake()
			continue
		}
		if ctx.Err() != nil || errors.Is(err, context.Canceled) {
			return
		}
		r.throttle.Warn("listen", "saga runner: LISTEN connection lost", "err", err)
		closeConn()
	}
}
