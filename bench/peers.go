package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"time"
)

// peerRun is one run of bench/peers: steps/s of the peers on the same
// workload as the step scenario.
type peerRun struct {
	DBOS, River, RiverFast float64
}

// runPeers runs the bench/peers binary (Config.Peers) on the bench's server
// on peerSagas processes of the step scenario's workload, one round, and
// reads the JSON line it prints last. bench/peers is a module of its own, so
// the relay never links the peers: it runs them as a program.
func (r *run) runPeers(ctx context.Context, i int) (peerRun, error) {
	var out peerRun
	r.progress("steps: run %d/%d: the peers (DBOS Transact, River, River with a 1 ms fetch cooldown) on %d processes", i+1, r.sz.repeats, r.sz.peerSagas)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.cfg.Peers, "--database-url", r.env.adminURL, "--n", strconv.Itoa(r.sz.peerSagas),
		"--repeats", "1", "--systems", "dbos,river,river-fast", "--json")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return out, fmt.Errorf("peers (%s): %w: %s", r.cfg.Peers, err, lastLines(stderr.String(), 5))
	}
	lines := bytes.Split(bytes.TrimSpace(stdout.Bytes()), []byte("\n"))
	var got struct {
		Systems map[string]struct {
			StepsPerSec float64 `json:"steps_per_sec"`
		} `json:"systems"`
	}
	if err := json.Unmarshal(lines[len(lines)-1], &got); err != nil {
		return out, fmt.Errorf("peers: reading its JSON line: %w", err)
	}
	out.DBOS = got.Systems["dbos"].StepsPerSec
	out.River = got.Systems["river"].StepsPerSec
	out.RiverFast = got.Systems["river-fast"].StepsPerSec
	r.progress("steps: run %d/%d: peers: DBOS %.0f, River %.0f, River 1 ms %.0f steps/s", i+1, r.sz.repeats, out.DBOS, out.River, out.RiverFast)
	return out, nil
}
