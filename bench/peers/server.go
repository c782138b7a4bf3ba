package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/internal/pgcluster"
	"github.com/compensa/compensa/internal/pgcluster/pgdocker"
)

// server is the PostgreSQL every system runs on: one database per run,
// dropped after it, so that each starts from empty tables.
type server struct {
	cluster  *pgcluster.Cluster
	adminURL string
	version  string
	kind     string
	binDir   string
}

func openServer(ctx context.Context, databaseURL string) (*server, error) {
	s := &server{adminURL: databaseURL, kind: "given by --database-url"}
	if databaseURL == "" {
		progress("starting a throwaway PostgreSQL (durable: fsync and synchronous_commit on)")
		c, err := pgdocker.Start(ctx, pgcluster.Options{Durable: true})
		if err != nil {
			return nil, err
		}
		s.cluster, s.adminURL, s.kind = c, c.URL, "throwaway "+string(c.Kind)+" cluster"
		s.binDir = c.BinDir
	}
	if s.binDir == "" {
		s.binDir, _ = pgcluster.FindBinDir()
	}
	conn, err := pgx.Connect(ctx, s.adminURL)
	if err != nil {
		s.close()
		return nil, fmt.Errorf("connect to the server: %w", err)
	}
	defer conn.Close(ctx)
	if err := conn.QueryRow(ctx, `SHOW server_version`).Scan(&s.version); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

func (s *server) close() {
	if s.cluster != nil {
		s.cluster.Stop()
	}
}

// freshDB creates an empty database for one run and returns its URL and a
// function that drops it.
func (s *server) freshDB(ctx context.Context, name string) (string, func(), error) {
	admin, err := pgx.Connect(ctx, s.adminURL)
	if err != nil {
		return "", nil, err
	}
	defer admin.Close(ctx)
	name = fmt.Sprintf("peers_%s_%d", strings.ReplaceAll(name, "-", "_"), os.Getpid())
	for _, q := range []string{"DROP DATABASE IF EXISTS " + name + " WITH (FORCE)", "CREATE DATABASE " + name, "CHECKPOINT"} {
		if _, err := admin.Exec(ctx, q); err != nil {
			return "", nil, fmt.Errorf("%s: %w", q, err)
		}
	}
	u, err := url.Parse(s.adminURL)
	if err != nil {
		return "", nil, err
	}
	u.Path = "/" + name
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, s.adminURL); err == nil {
			_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			c.Close(ctx)
		}
	}
	return u.String(), drop, nil
}

func (s *server) runOne(ctx context.Context, sys string, round, n int, pgbT time.Duration) (Result, error) {
	dsn, drop, err := s.freshDB(ctx, sys)
	if err != nil {
		return Result{}, err
	}
	defer drop()
	var res Result
	switch sys {
	case "compensa":
		res, err = runCompensa(ctx, dsn, n, 0)
	case "compensa-single":
		res, err = runCompensa(ctx, dsn, n, 1)
	case "dbos":
		res, err = runDBOS(ctx, dsn, n)
	case "river":
		res, err = runRiver(ctx, dsn, n, 0)
	case "river-fast":
		res, err = runRiver(ctx, dsn, n, time.Millisecond)
	case "pgbench":
		res, err = runPgbench(ctx, s.binDir, dsn, n, pgbT)
	default:
		err = fmt.Errorf("unknown system %q", sys)
	}
	res.System = sys
	return res, err
}

// counters are the cluster-wide figures read before and after a run: the
// next transaction id (write transactions) and the WAL insert position.
type counters struct {
	xid uint64
	wal int64
}

func readCounters(ctx context.Context, dsn string) (counters, error) {
	var c counters
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return c, err
	}
	defer conn.Close(ctx)
	var xid string
	err = conn.QueryRow(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text,
		pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint`).Scan(&xid, &c.wal)
	if err != nil {
		return c, err
	}
	c.xid, err = strconv.ParseUint(xid, 10, 64)
	return c, err
}

func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f, _ := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	return f
}
