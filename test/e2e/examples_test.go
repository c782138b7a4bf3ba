package e2e

import (
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

// An application that happens to have the example tables gets no example
// saga: `relay run` registers it only with --with-examples.
func TestRunRegistersTheExampleSagaOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t) // the harness's databases hold the example schema

	// --with-examples=false is the default spelled out, so that the harness
	// does not add the flag for a database with the example schema.
	p := relaytest.Start(t, nil, relayArgs(db, "--with-examples=false")...)
	trigger := createBrief(t, db, "no example saga", true)
	ignored := regexp.MustCompile(`(?m)^compensa_events_total\{[^}]*outcome="ignored"[^}]*\} [1-9]`)
	testkit.WaitFor(t, 30*time.Second, "the trigger streamed and counted as ignored", func() bool {
		resp, err := http.Get("http://" + p.Addr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return ignored.Match(body)
	})
	if !strings.Contains(p.Output(), "no sagas registered") {
		t.Errorf("the relay does not say it runs no saga:\n%s", p.Output())
	}
	if n := instancesFor(t, db, trigger); n != 0 {
		t.Fatalf("the example trigger started %d instances on a relay run without --with-examples", n)
	}
	p.Stop(30 * time.Second)

	p = relaytest.Start(t, nil, relayArgs(db, "--with-examples")...)
	second := createBrief(t, db, "example saga asked for", true)
	testkit.WaitFor(t, 30*time.Second, "the example saga started with --with-examples", func() bool {
		return instancesFor(t, db, second) == 1
	})
	p.Stop(30 * time.Second)
}

// --with-examples on a database without the example schema is a start-up
// error that says how to create it.
func TestRunWithExamplesNeedsTheExampleSchema(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmptyDB(t)
	if out, code := relaytest.Run(t, nil, "migrate", "--create-slot", "--database-url", db.URL, "--slot", db.Slot, "--publication", db.Publication); code != 0 {
		t.Fatalf("migrate: code %d\n%s", code, out)
	}
	out, code := relaytest.Run(t, nil, append([]string{"run", "--http-addr", "127.0.0.1:0"}, relayArgs(db, "--with-examples")...)...)
	if code != 2 || !strings.Contains(out, "relay migrate --with-examples") {
		t.Fatalf("relay run --with-examples without the example schema: code %d, want 2 naming `relay migrate --with-examples`\n%s", code, out)
	}
}
