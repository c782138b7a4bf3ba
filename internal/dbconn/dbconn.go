// Package dbconn opens the relay's connections to PostgreSQL and turns the usual
// failures into one line that says what is wrong and what to do. It promises
// that no message it returns contains the connection string's password.
package dbconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
)

// connectTimeout bounds the first connection: a server that does not answer
// should fail the command with a clear line, not hang it.
const connectTimeout = 15 * time.Second

// ErrNoDatabase is returned when no connection string was given.
var ErrNoDatabase = errors.New("no database: pass --database-url postgres://user:password@host:5432/db or set RELAY_DATABASE_URL")

// ErrInvalidDSN is the kind of the error for a connection string that does
// not parse.
var ErrInvalidDSN = errors.New("invalid connection string")

// Connect opens one connection.
func Connect(ctx context.Context, dsn string) (*pgx.Conn, error) {
	if dsn == "" {
		return nil, ErrNoDatabase
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, parseError(err, dsn)
	}
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return nil, connectError(cfg.Host, cfg.Port, cfg.User, cfg.Database, err)
	}
	return conn, nil
}

// OpenPool is Connect for a pool of at most maxConns connections (0: pgx's
// default); it checks the server answers before returning.
func OpenPool(ctx context.Context, dsn string, maxConns int32) (*pgxpool.Pool, error) {
	return openPool(ctx, dsn, maxConns, false)
}

// OpenStepPool is OpenPool for the pool saga steps run on: a statement whose
// context ends is cancelled on the server (CancelStatementsOnServer).
func OpenStepPool(ctx context.Context, dsn string, maxConns int32) (*pgxpool.Pool, error) {
	return openPool(ctx, dsn, maxConns, true)
}

func openPool(ctx context.Context, dsn string, maxConns int32, cancelOnServer bool) (*pgxpool.Pool, error) {
	if dsn == "" {
		return nil, ErrNoDatabase
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, parseError(err, dsn)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	if cancelOnServer {
		CancelStatementsOnServer(cfg.ConnConfig)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, parseError(err, dsn)
	}
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := pool.Ping(cctx); err != nil {
		pool.Close()
		c := cfg.ConnConfig
		return nil, connectError(c.Host, c.Port, c.User, c.Database, err)
	}
	return pool, nil
}

// cancelGrace is how long a statement whose context ended may take to stop
// after the server was asked to cancel it, before the connection is closed
// after all.
const cancelGrace = 2 * time.Second

// CancelStatementsOnServer makes a statement whose context ends (a step's
// timeout) be cancelled by the server (a cancel request: the statement fails
// with query_canceled) instead of by closing the connection, pgx's default.
// The connection and its transaction outlive the statement: a group of steps
// sharing one transaction rolls the timed-out step back to its savepoint and
// commits the others. The connection is closed only when the server has not
// stopped the statement within cancelGrace.
func CancelStatementsOnServer(cfg *pgx.ConnConfig) {
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: cancelGrace}
	}
}

// ConnectError wraps a failure to reach or log in to PostgreSQL; Unwrap gives
// the driver's error (a *pgconn.PgError for a server's refusal).
type ConnectError struct {
	msg string
	err error
}

func (e *ConnectError) Error() string { return e.msg }
func (e *ConnectError) Unwrap() error { return e.err }

func parseError(err error, dsn string) error {
	return &ConnectError{
		msg: parseErrorMessage(err, dsn),
		err: ErrInvalidDSN,
	}
}

func connectError(host string, port uint16, user, database string, err error) error {
	where := fmt.Sprintf("%s:%d database %q as user %q", host, port, database, user)
	var pgErr *pgconn.PgError
	wrap := func(format string, args ...any) error {
		return &ConnectError{msg: fmt.Sprintf(format, args...), err: err}
	}
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "28P01", "28000":
			return wrap("cannot log in to PostgreSQL at %s: %s; check the user and password in --database-url and pg_hba.conf", where, pgErr.Message)
		case "3D000":
			return wrap("database %q does not exist on %s:%d: create it or fix --database-url", database, host, port)
		}
		return wrap("cannot connect to PostgreSQL at %s: %s (SQLSTATE %s)", where, pgErr.Message, pgErr.Code)
	}
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, context.DeadlineExceeded) {
		return wrap("cannot reach PostgreSQL at %s: is the server running and is --database-url right? (%s)", where, rootCause(err))
	}
	return wrap("cannot connect to PostgreSQL at %s: %s; check --database-url", where, rootCause(err))
}

// Explain turns a failure to connect that a query of pool met (the server
// went away after OpenPool) into the one-line message OpenPool gives; any
// other error is returned as it is.
func Explain(pool *pgxpool.Pool, err error) error {
	var ce *pgconn.ConnectError
	if err == nil || pool == nil || !errors.As(err, &ce) {
		return err
	}
	c := pool.Config().ConnConfig
	return connectError(c.Host, c.Port, c.User, c.Database, err)
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

// PasswordOf returns the password in a PostgreSQL URL or keyword/value DSN, or
// "" when there is none or it cannot be parsed.
func PasswordOf(dsn string) string {
	if dsn == "" {
		return ""
	}
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if p, ok := u.User.Password(); ok {
			return p
		}
	}
	if cfg, err := pgconn.ParseConfig(dsn); err == nil && cfg.Password != "" {
		return cfg.Password
	}
	return ""
}

// RedactAll replaces each secret (raw and URL-escaped) in s where it stands
// as a whole word (see replaceWhole).
func RedactAll(s string, secrets []string) string {
	for _, p := range secrets {
		if len(p) < 1 {
			continue
		}
		s = replaceWhole(s, p, "xxxxx")
		if esc := url.QueryEscape(p); esc != p {
			s = replaceWhole(s, esc, "xxxxx")
		}
		if esc := url.PathEscape(p); esc != p {
			s = replaceWhole(s, esc, "xxxxx")
		}
	}
	return s
}
