// Command peers runs one workload — N processes of three trivial durable
// steps — on Compensa's step runner, on DBOS Transact Go and on River
// (default settings, and with a 1 ms fetch cooldown), plus pgbench running
// the shape of one step, against the same throwaway PostgreSQL, interleaved,
// and prints one table. It is a module of its own so that the product never
// depends on the peers it is measured against.
//
//	go run . [--n 5000] [--repeats 3] [--systems compensa,dbos,river,river-fast,pgbench] [--json]
//
// `make bench-peers` runs it; `relay-bench --peers BIN` runs it between the
// step scenario's runs and reports the peers' steps/s in its JSON.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"
)

// allSystems are the systems in the order each round runs them.
var allSystems = []string{"compensa", "compensa-single", "dbos", "river", "river-fast", "pgbench"}

func main() {
	var (
		url     = flag.String("database-url", "", "PostgreSQL server to measure on (a role with CREATEDB); empty starts a throwaway durable cluster from the local binaries")
		n       = flag.Int("n", 5000, "processes per run")
		repeats = flag.Int("repeats", 3, "rounds; each system runs once per round, interleaved, and the table shows medians")
		systems = flag.String("systems", strings.Join(allSystems, ","), "comma-separated systems to run: "+strings.Join(allSystems, ", "))
		asJSON  = flag.Bool("json", false, "print the medians as one JSON object on the last line of stdout")
		pgbT    = flag.Duration("pgbench-time", 10*time.Second, "how long pgbench runs per round")
	)
	flag.Parse()
	if flag.NArg() > 0 {
		fail(2, "unexpected argument %q: peers takes flags only (see -h)", flag.Arg(0))
	}
	var want []string
	for _, s := range strings.Split(*systems, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if !slices.Contains(allSystems, s) {
			fail(2, "--systems: unknown system %q: choose from %s", s, strings.Join(allSystems, ", "))
		}
		want = append(want, s)
	}
	if len(want) == 0 || *n < 1 || *repeats < 1 {
		fail(2, "--systems must name at least one system, --n and --repeats must be at least 1")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if err := run(ctx, *url, want, *n, *repeats, *pgbT, *asJSON); err != nil {
		fail(1, "%v", err)
	}
}

// run measures every system and prints the table; the throwaway cluster is
// stopped whatever happens (an error, an interrupt).
func run(ctx context.Context, url string, want []string, n, repeats int, pgbT time.Duration, asJSON bool) error {
	srv, err := openServer(ctx, url)
	if err != nil {
		return err
	}
	defer srv.close()
	progress("server: PostgreSQL %s (%s), load average %.2f", srv.version, srv.kind, loadAverage())

	results := map[string][]Result{}
	loadStart := loadAverage()
	for round := 1; round <= repeats; round++ {
		for _, sys := range want {
			if ctx.Err() != nil {
				return fmt.Errorf("interrupted")
			}
			progress("round %d/%d: %s (n=%d, load %.2f)", round, repeats, sys, n, loadAverage())
			res, err := srv.runOne(ctx, sys, round, n, pgbT)
			if err != nil {
				return fmt.Errorf("%s, round %d: %w", sys, round, err)
			}
			progress("round %d/%d: %s: %.0f steps/s", round, repeats, sys, res.StepsPerSec)
			results[sys] = append(results[sys], res)
		}
	}
	table := Table{N: n, Repeats: repeats, LoadStart: loadStart, LoadEnd: loadAverage(), PostgreSQL: srv.version}
	for _, sys := range want {
		table.Rows = append(table.Rows, medianOf(sys, results[sys]))
	}
	table.write(os.Stdout)
	if asJSON {
		b, _ := json.Marshal(table.summary())
		fmt.Printf("%s\n", b)
	}
	return nil
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func fail(code int, format string, args ...any) {
	fmt.Fprintf(os.Stderr, "peers: "+format+"\n", args...)
	os.Exit(code)
}
