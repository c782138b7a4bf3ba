package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compensa/compensa/test/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// buildBench builds cmd/relay-bench without the race detector: what CI
// runs, and a benchmark binary under -race would measure the detector.
func buildBench(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	bin := filepath.Join(t.TempDir(), "relay-bench")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/relay-bench")
	cmd.Dir = filepath.Dir(file)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/relay-bench: %v\n%s", err, out)
	}
	return bin
}

// quickNull are the keys a quick run leaves null (present, never omitted):
// the claim at 1,000,000 due instances is a full-size figure, the peers
// run only with --peers, and the sinks' latency runs at 200 and 1,000
// events/s, so its 5,000 events/s figures are not measured.
var quickNull = map[string]bool{"claim_ms_1m": true, "peer_dbos_steps_per_sec": true, "peer_river_steps_per_sec": true,
	"nats_sink_latency_p50_ms_5k": true, "nats_sink_latency_p99_ms_5k": true, "webhook_sink_latency_p50_ms_5k": true,
	"webhook_sink_latency_p99_ms_5k": true, "kafka_sink_latency_p50_ms_5k": true, "kafka_sink_latency_p99_ms_5k": true}

// TestQuickBenchCommand is the smoke test CI runs: `relay-bench
// --quick --json` on a throwaway PostgreSQL finishes in well under two
// minutes, measures every headline figure and prints them as the last line.
func TestQuickBenchCommand(t *testing.T) {
	bin := buildBench(t)
	// The budget is two minutes on a quiet machine; the hard limit leaves
	// room for a loaded one (the figures then mean little, the test only
	// checks that everything runs).
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--quick", "--json")
	// No --database-url, as CI runs it: a throwaway cluster (or the server
	// RELAY_TEST_DATABASE_URL names, as the harness would use).
	cmd.Env = withoutEnv(os.Environ(), "RELAY_DATABASE_URL", "DATABASE_URL")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	began := time.Now()
	err := cmd.Run()
	took := time.Since(began)
	if err != nil {
		t.Fatalf("relay-bench --quick: %v after %s\nstdout:\n%s\nstderr:\n%s", err, took, stdout.String(), stderr.String())
	}
	t.Logf("relay-bench --quick took %s\n%s", took.Round(time.Second), stdout.String())
	if took > 2*time.Minute {
		t.Logf("relay-bench --quick took %s, more than the two-minute budget: is the machine loaded? (load average %.2f)", took, loadAverage())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var got map[string]any
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
		t.Fatalf("the last line is not a JSON object: %q: %v", lines[len(lines)-1], err)
	}
	for _, k := range requiredKeys {
		if v, present := got[k]; quickNull[k] && present && v == nil {
			continue // not measured by design in a quick run without --peers
		}
		if v, present := got[k]; k == "server_ms_per_step" && present && v == nil && os.Getenv("RELAY_TEST_DATABASE_URL") != "" {
			continue // a server of the caller's may not load pg_stat_statements; the throwaway one does
		}
		if v, ok := got[k].(float64); !ok || v <= 0 {
			t.Errorf("%s = %v, want a positive number", k, got[k])
		}
	}
	if got["resources_in_process"] != false {
		t.Errorf("resources_in_process = %v: the quick run must measure a child relay", got["resources_in_process"])
	}
	for _, want := range []string{"1. stream throughput", "producer cost per event", "sinks (1 row/tx, no sagas)", "sink latency (ms, commit → ack)", "2. latency", "3. step throughput", "3c. capacity", "latency at a share of capacity", "4/5. stream+correlator cost curve"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("the table lacks %q", want)
		}
	}
}

func withoutEnv(env []string, names ...string) []string {
	var out []string
next:
	for _, kv := range env {
		for _, n := range names {
			if strings.HasPrefix(kv, n+"=") {
				continue next
			}
		}
		out = append(out, kv)
	}
	return out
}

// TestOnlyRejectsAnUnknownScenario: a typo fails at once, before any
// PostgreSQL is started, naming the choices.
func TestOnlyRejectsAnUnknownScenario(t *testing.T) {
	t.Parallel()
	_, err := Run(context.Background(), Config{Only: "streem"})
	if err == nil || !strings.Contains(err.Error(), "stream, sinks, sinklatency, latency, steps, capacity, declared, claim, curve") {
		t.Fatalf("err = %v", err)
	}
}

// TestGivenServerIsLeftAsItWas: with a server of the caller's (what
// --database-url gives), the bench works in a database of its own and drops
// it, with its slots, at the end. Without a child command it measures in
// process and says so.
func TestGivenServerIsLeftAsItWas(t *testing.T) {
	c := pgtest.Cluster(t)
	ctx := context.Background()
	report, err := Run(ctx, Config{DatabaseURL: c.URL, Quick: true, Only: "curve"})
	if err != nil {
		t.Fatal(err)
	}
	if len(report.Errors) > 0 {
		t.Fatalf("errors: %v", report.Errors)
	}
	if len(report.Curve) != 1 || report.Curve[0].Events != 10000 || report.Curve[0].EventsPerSec <= 0 {
		t.Fatalf("curve = %+v", report.Curve)
	}
	if !report.Curve[0].InProcess || report.Curve[0].PeakRSSMB <= 0 {
		t.Fatalf("in-process measurement not reported: %+v", report.Curve[0])
	}
	if !strings.Contains(strings.Join(report.Notes, " "), "inside the bench process") {
		t.Fatalf("notes do not say resources were measured in process: %v", report.Notes)
	}
	pool := pgtest.NewDB(t).Pool
	var dbs, slots int
	name := "compensa_bench_" + strconv.Itoa(os.Getpid())
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname = $1`, name).Scan(&dbs); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE $1 || '%'`, name).Scan(&slots); err != nil {
		t.Fatal(err)
	}
	if dbs != 0 || slots != 0 {
		t.Fatalf("left behind: %d databases and %d slots named %s*", dbs, slots, name)
	}
}
