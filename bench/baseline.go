package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
)

// runRecvlogical runs PostgreSQL's own logical replication client on slot
// from its position to endLSN, decoding with pgoutput into /dev/null: the
// ceiling for any consumer of that slot on this server. It returns the wall
// time from process start to exit (connection set-up included, as it is for
// the relay's stream).
func (e *env) runRecvlogical(ctx context.Context, slot string, endLSN pglogrepl.LSN, timeout time.Duration, messages bool) (time.Duration, error) {
	bin, err := e.tool("pg_recvlogical")
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin,
		"--dbname", e.url,
		"--slot", slot,
		"--start",
		"--endpos", endLSN.String(),
		"--file", os.DevNull,
		"--no-loop",
		"--option", "proto_version=1",
		"--option", "publication_names="+e.pub,
	)
	if messages {
		cmd.Args = append(cmd.Args, "--option", "messages=true")
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	began := time.Now()
	err = cmd.Run()
	took := time.Since(began)
	if ctx.Err() != nil {
		return 0, fmt.Errorf("bench: pg_recvlogical did not reach %s within %s", endLSN, timeout)
	}
	if err != nil {
		return 0, fmt.Errorf("bench: pg_recvlogical: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	return took, nil
}

var pgbenchTPS = regexp.MustCompile(`tps = ([0-9]+(?:\.[0-9]+)?)`)

// pgbenchResult is one pgbench run.
type pgbenchResult struct {
	TPS      float64
	Clients  int
	Threads  int
	Duration time.Duration
}

// runPgbenchSteps runs pgbench with the step-shaped script (one INSERT plus
// one UPDATE by primary key per transaction) for d with 8 clients on 2
// threads, over rows state rows.
func (e *env) runPgbenchSteps(ctx context.Context, d time.Duration, rows int) (pgbenchResult, error) {
	res := pgbenchResult{Clients: 8, Threads: 2, Duration: d.Round(time.Second)}
	if res.Duration < time.Second {
		res.Duration = time.Second
	}
	bin, err := e.tool("pgbench")
	if err != nil {
		return res, err
	}
	if _, err := e.pool.Exec(ctx, `TRUNCATE bench_pgbench_state, bench_pgbench_log`); err != nil {
		return res, err
	}
	if _, err := e.pool.Exec(ctx, `INSERT INTO bench_pgbench_state (id) SELECT generate_series(1, $1::int)`, rows); err != nil {
		return res, err
	}
	if _, err := e.pool.Exec(ctx, `VACUUM ANALYZE bench_pgbench_state`); err != nil {
		return res, err
	}
	e.checkpoint(ctx)
	dir, err := os.MkdirTemp("", "compensa-pgbench-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	script := filepath.Join(dir, "step.sql")
	if err := os.WriteFile(script, []byte(pgbenchStepScript), 0o644); err != nil {
		return res, err
	}
	ctx, cancel := context.WithTimeout(ctx, res.Duration+2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin,
		"--no-vacuum",
		"--protocol", "prepared",
		"--client", strconv.Itoa(res.Clients),
		"--jobs", strconv.Itoa(res.Threads),
		"--time", strconv.Itoa(int(res.Duration/time.Second)),
		"--define", "rows="+strconv.Itoa(rows),
		"--file", script,
		e.url,
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return res, fmt.Errorf("bench: pgbench: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	m := pgbenchTPS.FindStringSubmatch(stdout.String())
	if m == nil {
		return res, fmt.Errorf("bench: no tps in pgbench's output: %s", strings.TrimSpace(stdout.String()))
	}
	res.TPS, _ = strconv.ParseFloat(m[1], 64)
	return res, nil
}
