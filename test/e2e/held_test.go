package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/relaytest"
	"github.com/compensa/compensa/test/testkit"
)

// bookingSaga is a saga NAME on EVENT whose first step books a row, undone
// by its compensation, and whose second step is then.
func bookingSaga(name, eventType, then string) string {
	return strings.NewReplacer("NAME", name, "EVENT", eventType).Replace(`saga: NAME
version: 1
triggers:
  - event_type: EVENT
defaults:
  timeout: 5s
  retry: { max_attempts: 2, initial: 50ms, factor: 2, max: 300ms }
  compensation_retry: { max_attempts: 2, initial: 50ms, factor: 2, max: 300ms }
steps:
  - name: book
    sql:
      query: INSERT INTO bookings (id) VALUES ($1::uuid)
      params: ["${ trigger.payload.id }"]
    compensate:
      sql:
        query: DELETE FROM bookings WHERE id = $1::uuid
        params: ["${ trigger.payload.id }"]
`) + then
}

// noteStep writes a note: the relay's role is granted bookings but not
// notes at first, and notes.amount must be positive.
const noteStep = `  - name: note
    sql:
      query: INSERT INTO notes (id, amount) VALUES ($1::uuid, $2)
      params: ["${ trigger.payload.id }", "${ trigger.payload.amount }"]
`

// callStep calls a participant at PAYSVC: one that is not listening at
// first, or one that answers 503.
const callStep = `  - name: call
    http: { method: POST, url: "PAYSVC/charges", body: { id: "${ trigger.payload.id }" } }
`

// An operator's mistake never undoes business: a declared sql step on a
// table the relay was not granted, and an http step whose participant is
// not listening, hold their instances (listed as stuck, with the reason)
// and compensate nothing, for as long as the cause lasts; once it is fixed
// they complete. The step's own answers still compensate: a CHECK
// violation, and a 5xx after max_attempts.
func TestOperatorMistakesHoldAndNeverCompensate(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	role, roleURL := grantedRole(t, db, "held-S3cret")
	if _, err := db.Pool.Exec(ctx, `
CREATE TABLE bookings (id uuid PRIMARY KEY);
CREATE TABLE notes (id uuid PRIMARY KEY, amount integer NOT NULL CHECK (amount > 0));`); err != nil {
		t.Fatal(err)
	}
	if out, code := relaytest.Run(t, nil, "migrate", "--grant-to", role, "--database-url", db.URL, "--publication", db.Publication); code != 0 {
		t.Fatalf("relay migrate --grant-to: code %d\n%s", code, out)
	}
	// The forgotten GRANT: bookings only, not notes.
	if _, err := db.Pool.Exec(ctx, fmt.Sprintf(`GRANT SELECT, INSERT, DELETE ON bookings TO %s`, role)); err != nil {
		t.Fatal(err)
	}

	// A port nobody listens on, taken later by the participant.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := ln.Addr().String()
	ln.Close()
	failing := newSwitchable()
	failing.down.Store(true) // 503, always
	failSrv := httptest.NewServer(failing)
	defer failSrv.Close()

	dir := t.TempDir()
	writeSaga(t, dir, "held_sql.yaml", bookingSaga("held_sql", "note.requested", noteStep), "")
	writeSaga(t, dir, "held_http.yaml", bookingSaga("held_http", "call.requested", callStep), "http://"+deadAddr)
	writeSaga(t, dir, "failing_http.yaml", bookingSaga("failing_http", "fail.requested", callStep), failSrv.URL)
	p := relaytest.Start(t, nil,
		"--database-url", roleURL, "--slot", db.Slot, "--publication", db.Publication,
		"--status-interval", "200ms", "--heartbeat-interval", "1s", "--workers", "4",
		"--sagas", dir, "--hold-after", "1s")
	defer p.Stop(30 * time.Second)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("relay output:\n%s", p.Output())
		}
	})

	emit := func(eventType string, amount int) uuid.UUID {
		id, ev := uuid.New(), uuid.New()
		if _, err := db.Pool.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
			VALUES ($1, 'booking', $2, $3, $4)`, ev, id.String(), eventType, fmt.Sprintf(`{"id": %q, "amount": %d}`, id, amount)); err != nil {
			t.Fatal(err)
		}
		return ev
	}
	var notes, calls []uuid.UUID
	for range 3 {
		notes = append(notes, emit("note.requested", 5))
		calls = append(calls, emit("call.requested", 5))
	}
	checkViolation := emit("note.requested", -1)
	fiveHundreds := emit("fail.requested", 0)

	// The step's own answer compensates, at once: the 503 after two
	// attempts.
	testkit.WaitFor(t, 60*time.Second, "the 503 saga to compensate", func() bool { return statusOf(t, db, fiveHundreds) == "COMPENSATED" })

	// Held: many attempts past max_attempts 2, nothing compensated.
	failedAttempts := func(ev uuid.UUID) int {
		return count(t, db, `SELECT count(*) FROM saga_events e JOIN saga_instances i ON i.id = e.instance_id
			WHERE i.trigger_event_id = $1 AND e.kind = 'step_failed'`, ev)
	}
	held := append(append(append([]uuid.UUID{}, notes...), calls...), checkViolation)
	testkit.WaitFor(t, 60*time.Second, "five failed attempts of every held instance", func() bool {
		for _, ev := range held {
			if failedAttempts(ev) < 5 {
				return false
			}
		}
		return true
	})
	for _, ev := range held {
		if st := statusOf(t, db, ev); st != "RUNNING" {
			t.Fatalf("held instance of %s is %s, want RUNNING", ev, st)
		}
		if n := count(t, db, `SELECT count(*) FROM saga_events e JOIN saga_instances i ON i.id = e.instance_id
			WHERE i.trigger_event_id = $1 AND e.kind LIKE 'compensation%'`, ev); n != 0 {
			t.Fatalf("held instance of %s started compensating", ev)
		}
	}
	if n := count(t, db, `SELECT count(*) FROM bookings`); n != len(held) {
		t.Fatalf("%d bookings, want %d: a held instance's first step was undone", n, len(held))
	}

	// Listed as stuck (held), with the reason.
	var page struct {
		Items []struct {
			SagaName    string `json:"saga_name"`
			StuckReason string `json:"stuck_reason"`
			StuckDetail string `json:"stuck_detail"`
			LastError   string `json:"last_error"`
		} `json:"items"`
	}
	testkit.WaitFor(t, 30*time.Second, "the held instances in `relay sagas list --stuck`", func() bool {
		out, code := relaytest.Run(t, nil, "sagas", "list", "--stuck", "--json", "--hold-after", "1s", "--database-url", db.URL)
		if code != 0 {
			t.Fatalf("relay sagas list --stuck: code %d\n%s", code, out)
		}
		if err := json.Unmarshal([]byte(out), &page); err != nil {
			t.Fatalf("relay sagas list --stuck --json: %v\n%s", err, out)
		}
		return len(page.Items) == len(held)
	})
	for _, it := range page.Items {
		want := "permission denied for table notes"
		if it.SagaName == "held_http" {
			want = "connection refused"
		}
		if it.StuckReason != "held" || !strings.Contains(it.LastError, want) || !strings.Contains(it.StuckDetail, "never compensated") {
			t.Fatalf("stuck item %+v: want reason held, an error with %q and a detail that says what to do", it, want)
		}
	}
	out, _ := relaytest.Run(t, nil, "sagas", "list", "--stuck", "--hold-after", "1s", "--database-url", db.URL)
	if !strings.Contains(out, "held") {
		t.Fatalf("relay sagas list --stuck does not say held:\n%s", out)
	}

	// The operator fixes both causes: everything completes, but the CHECK
	// violation, now the step's own answer, which compensates.
	if _, err := db.Pool.Exec(ctx, fmt.Sprintf(`GRANT INSERT ON notes TO %s`, role)); err != nil {
		t.Fatal(err)
	}
	participant := newSwitchable()
	ln, err = net.Listen("tcp", deadAddr)
	if err != nil {
		t.Fatalf("listen on %s again: %v", deadAddr, err)
	}
	srv := &http.Server{Handler: participant}
	go srv.Serve(ln)
	defer srv.Close()
	testkit.WaitFor(t, 90*time.Second, "the held instances to finish", func() bool {
		for _, ev := range append(append([]uuid.UUID{}, notes...), calls...) {
			if statusOf(t, db, ev) != "COMPLETED" {
				return false
			}
		}
		return statusOf(t, db, checkViolation) == "COMPENSATED"
	})
	if n := count(t, db, `SELECT count(*) FROM bookings`); n != len(notes)+len(calls) {
		t.Fatalf("%d bookings, want %d (the CHECK violation's undone, the others kept)", n, len(notes)+len(calls))
	}
	if n := count(t, db, `SELECT count(*) FROM saga_instances WHERE held_since IS NOT NULL`); n != 0 {
		t.Fatalf("%d instances still marked held", n)
	}
}
