package main

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/internal/dbconn"
)

// connect opens one connection to --database-url; see dbconn for the errors.
func connect(ctx context.Context, opts *rootOptions) (*pgx.Conn, error) {
	return dbconn.Connect(ctx, opts.DatabaseURL)
}

// openPool is connect for a pool.
func openPool(ctx context.Context, opts *rootOptions, maxConns int32) (*pgxpool.Pool, error) {
	return dbconn.OpenPool(ctx, opts.DatabaseURL, maxConns)
}
