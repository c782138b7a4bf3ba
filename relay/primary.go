package relay

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/compensa/compensa/internal/backoff"
)

// WaitForPrimary returns once dsn leads to a primary (a server not in
// recovery). While every reachable host is a standby (read-only) — the
// moments between a primary's failure and a standby's promotion, or a URL
// that names only standbys — it logs why and tries again with a capped
// backoff, until ctx ends. A database that cannot be reached at all, or a
// DSN that does not parse, is returned at once: that is not a failover.
func WaitForPrimary(ctx context.Context, dsn string, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil // New reports a bad DSN with its own message
	}
	policy := backoff.Policy{Base: 500 * time.Millisecond, Max: 10 * time.Second}
	for attempt := 0; ; attempt++ {
		wait := policy.Delay(attempt)
		standby, err := probeStandby(ctx, cfg)
		if err != nil || !standby {
			return nil // a primary, or an error New reports as before
		}
		if attempt == 0 || attempt%10 == 0 {
			log.Warn("connected to a standby (read-only): waiting for a primary; name every host of the cluster with target_session_attrs=read-write so that the relay finds the primary by itself",
				"attempt", attempt+1, "wait", wait.Round(time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("relay: no primary while waiting for one: %w", ctx.Err())
		case <-time.After(wait):
		}
	}
}

// probeStandby connects as the DSN says; when that finds no host that
// satisfies target_session_attrs, it connects to any host and asks whether
// it is in recovery.
func probeStandby(ctx context.Context, cfg *pgconn.Config) (bool, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgconn.ConnectConfig(cctx, cfg)
	if err != nil && cfg.ValidateConnect != nil {
		anyHost := cfg.Copy()
		anyHost.ValidateConnect = nil
		conn, err = pgconn.ConnectConfig(cctx, anyHost)
	}
	if err != nil {
		return false, err
	}
	defer conn.Close(context.Background())
	res := conn.ExecParams(cctx, "SELECT pg_is_in_recovery()", nil, nil, nil, nil).Read()
	if res.Err != nil || len(res.Rows) != 1 {
		return false, res.Err
	}
	return string(res.Rows[0][0]) == "t", nil
}
