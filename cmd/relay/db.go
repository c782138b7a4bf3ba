package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// connect opens one connection, turning the usual failures into one line that
// says what is wrong and what to do. The password never appears in it.
func connect(ctx context.Context, opts *rootOptions) (*pgx.Conn, error) {
	dsn, err := opts.requireDatabase()
	if err != nil {
		return nil, err
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("--database-url is not a valid PostgreSQL URL or DSN: %s", redact(err.Error(), dsn))
	}
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return nil, connectError(cfg.Host, cfg.Port, cfg.User, cfg.Database, err)
	}
	return conn, nil
}

// openPool is connect for a pool; it checks the server answers before
// returning.
func openPool(ctx context.Context, opts *rootOptions, maxConns int32) (*pgxpool.Pool, error) {
	dsn, err := opts.requireDatabase()
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("--database-url is not a valid PostgreSQL URL or DSN: %s", redact(err.Error(), dsn))
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := pool.Ping(cctx); err != nil {
		pool.Close()
		c := cfg.ConnConfig
		return nil, connectError(c.Host, c.Port, c.User, c.Database, err)
	}
	return pool, nil
}

func connectError(host string, port uint16, user, database string, err error) error {
	where := fmt.Sprintf("%s:%d database %q as user %q", host, port, database, user)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "28P01", "28000":
			return fmt.Errorf("cannot log in to PostgreSQL at %s: %s; check the user and password in --database-url and pg_hba.conf", where, pgErr.Message)
		case "3D000":
			return fmt.Errorf("database %q does not exist on %s:%d: create it or fix --database-url", database, host, port)
		}
		return fmt.Errorf("cannot connect to PostgreSQL at %s: %s (SQLSTATE %s)", where, pgErr.Message, pgErr.Code)
	}
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("cannot reach PostgreSQL at %s: is the server running and is --database-url right? (%s)", where, rootCause(err))
	}
	return fmt.Errorf("cannot connect to PostgreSQL at %s: %s; check --database-url", where, rootCause(err))
}

// rootCause returns the innermost error's text on one line: pgconn joins the
// failures of every address it tried with newlines, which repeat each other.
func rootCause(err error) string {
	for {
		u := errors.Unwrap(err)
		if u == nil {
			break
		}
		err = u
	}
	lines := strings.Split(strings.TrimSpace(err.Error()), "\n")
	return lines[len(lines)-1]
}
