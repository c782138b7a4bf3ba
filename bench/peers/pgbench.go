package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgbenchStep is the shape of one step of an engine that spends one write
// transaction per step: a row appended, a row updated by primary key. (The
// same script as `relay-bench`'s step scenario.)
const pgbenchStep = `\set id random(1, :rows)
BEGIN;
INSERT INTO peers_log (state_id) VALUES (:id);
UPDATE peers_state SET counter = counter + 1, updated_at = now() WHERE id = :id;
END;
`

var tpsLine = regexp.MustCompile(`(?m)^tps = ([0-9.]+)`)

// runPgbench runs the step shape with 8 clients for d; a "process" is three
// such transactions, so processes/s is TPS / 3. Round trips per process:
// BEGIN, INSERT, UPDATE, END, for three steps.
func runPgbench(ctx context.Context, binDir, dsn string, n int, d time.Duration) (Result, error) {
	res := Result{Mode: "pgbench -M prepared -c 8 -j 2: one INSERT + one UPDATE by key per transaction, a process = 3 transactions"}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return res, err
	}
	for _, q := range []string{
		`CREATE TABLE peers_state (id integer PRIMARY KEY, counter integer NOT NULL DEFAULT 0, updated_at timestamptz NOT NULL DEFAULT now())`,
		`CREATE TABLE peers_log (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, state_id integer NOT NULL, at timestamptz NOT NULL DEFAULT now())`,
		fmt.Sprintf(`INSERT INTO peers_state (id) SELECT generate_series(1, %d)`, n),
		`VACUUM ANALYZE peers_state`,
		`CHECKPOINT`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			conn.Close(ctx)
			return res, err
		}
	}
	conn.Close(ctx)
	dir, err := os.MkdirTemp("", "peers-pgbench-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	script := filepath.Join(dir, "step.sql")
	if err := os.WriteFile(script, []byte(pgbenchStep), 0o644); err != nil {
		return res, err
	}
	bin := filepath.Join(binDir, "pgbench")
	if _, err := os.Stat(bin); err != nil {
		if bin, err = exec.LookPath("pgbench"); err != nil {
			return res, fmt.Errorf("pgbench not found next to the server binaries nor on PATH: install the PostgreSQL client programs")
		}
	}
	c0, err := readCounters(ctx, dsn)
	if err != nil {
		return res, err
	}
	secs := max(1, int(d/time.Second))
	cmd := exec.CommandContext(ctx, bin, "--no-vacuum", "--protocol", "prepared", "--client", "8", "--jobs", "2",
		"--time", strconv.Itoa(secs), "--define", "rows="+strconv.Itoa(n), "--file", script, dsn)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return res, fmt.Errorf("pgbench: %w: %s", err, errb.String())
	}
	c1, err := readCounters(ctx, dsn)
	if err != nil {
		return res, err
	}
	mt := tpsLine.FindSubmatch(out.Bytes())
	if mt == nil {
		return res, fmt.Errorf("pgbench printed no tps line: %s", out.String())
	}
	tps, _ := strconv.ParseFloat(string(mt[1]), 64)
	tx := tps * float64(secs)
	res.Processes = int(tx / stepsPerProcess)
	res.Seconds = float64(secs)
	res.StepsPerSec = tps
	res.ProcPerSec = tps / stepsPerProcess
	res.RoundTrips = 4 * stepsPerProcess
	if tx > 0 {
		res.WriteXacts = float64(c1.xid-c0.xid) / (tx / stepsPerProcess)
		res.WALBytes = float64(c1.wal-c0.wal) / (tx / stepsPerProcess)
	}
	return res, nil
}
