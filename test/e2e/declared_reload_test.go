package e2e

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

const reloadV1 = `saga: hup
version: 1
triggers: [{event_type: hup.start}]
steps:
  - name: done
    emit: [{event_type: hup.done, payload: { version: "${ saga.version }" }}]
`

// TestDeclaredReloadOnSIGHUP: SIGHUP with a broken file logs every problem
// and keeps the old set running; with a valid new version, new triggers
// start it.
func TestDeclaredReloadOnSIGHUP(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	dir := t.TempDir()
	writeSaga(t, dir, "hup.yaml", reloadV1, "")
	p := relaytest.Start(t, nil, relayArgs(db, "--sagas", dir)...)
	versionOf := func(ev uuid.UUID) int {
		var v int
		_ = db.Pool.QueryRow(context.Background(), `SELECT saga_version FROM saga_instances WHERE trigger_event_id = $1 AND status = 'COMPLETED'`, ev).Scan(&v)
		return v
	}
	start := func() uuid.UUID {
		ev := uuid.New()
		emitEvent(t, db, outbox.Message{ID: ev, EventType: "hup.start", Payload: map[string]any{}})
		return ev
	}
	first := start()
	testkit.WaitFor(t, 30*time.Second, "version 1 to complete", func() bool { return versionOf(first) == 1 })

	writeSaga(t, dir, "hup.yaml", strings.Replace(reloadV1, "version: 1", "version: 2\ncolour: red", 1), "")
	if err := p.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 30*time.Second, "the refused reload in the log", func() bool {
		return strings.Contains(p.Output(), `hup.yaml:3:1: unknown key \"colour\" in the file`) &&
			strings.Contains(p.Output(), "the previous set keeps running")
	})
	second := start()
	testkit.WaitFor(t, 30*time.Second, "version 1 to go on running", func() bool { return versionOf(second) == 1 })

	writeSaga(t, dir, "hup.yaml", strings.Replace(reloadV1, "version: 1", "version: 2", 1), "")
	if err := p.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 30*time.Second, "the reload in the log", func() bool { return strings.Contains(p.Output(), "saga reload done") })
	third := start()
	testkit.WaitFor(t, 30*time.Second, "version 2 to start on new triggers", func() bool { return versionOf(third) == 2 })
	p.Stop(30 * time.Second)
}

// TestDeclaredNameAlsoInGoIsRefused: a file saga with the name of a saga
// defined in Go (the briefs example) stops the relay at start.
func TestDeclaredNameAlsoInGoIsRefused(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	dir := t.TempDir()
	writeSaga(t, dir, "briefs.yaml", strings.Replace(reloadV1, "saga: hup", "saga: brief_enrichment", 1), "")
	out, code := relaytest.Run(t, nil, append([]string{"run", "--http-addr", "127.0.0.1:0"}, relayArgs(db, "--sagas", dir)...)...)
	if code != 2 || !strings.Contains(out, "briefs.yaml:1:1: saga brief_enrichment is also defined in Go in this relay; rename one of them") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}
