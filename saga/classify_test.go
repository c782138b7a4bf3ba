package saga_test

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/compensa/compensa/saga"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return &pgconn.PgError{Code: code, Message: "m"} }
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for _, c := range []struct {
		name string
		err  error
		want saga.ErrorClass
	}{
		{"permission denied", pg("42501"), saga.ClassOperator},
		{"undefined table", fmt.Errorf("step: %w", pg("42P01")), saga.ClassOperator},
		{"undefined column", pg("42703"), saga.ClassOperator},
		{"undefined function", pg("42883"), saga.ClassOperator},
		{"connection failure", pg("08006"), saga.ClassOperator},
		{"invalid password", pg("28P01"), saga.ClassOperator},
		{"no such database", pg("3D000"), saga.ClassOperator},
		{"no such schema", pg("3F000"), saga.ClassOperator},
		{"disk full", pg("53100"), saga.ClassOperator},
		{"admin shutdown", pg("57P01"), saga.ClassOperator},
		{"statement cancelled: the step's own timeout", pg("57014"), saga.ClassStep},
		{"serialization failure", pg("40001"), saga.ClassTransient},
		{"deadlock", pg("40P01"), saga.ClassTransient},
		{"lock not available", pg("55P03"), saga.ClassTransient},
		{"check violation", pg("23514"), saga.ClassStep},
		{"unique violation", pg("23505"), saga.ClassStep},
		{"data exception", pg("22P02"), saga.ClassStep},
		{"syntax error", pg("42601"), saga.ClassStep},
		{"raise exception", pg("P0001"), saga.ClassStep},
		{"connection refused", fmt.Errorf("call: %w", dial), saga.ClassOperator},
		{"no such host", &net.DNSError{Err: "no such host", Name: "payments.internal", IsNotFound: true}, saga.ClassOperator},
		{"unknown certificate authority", &x509.UnknownAuthorityError{}, saga.ClassOperator},
		{"pgx could not connect", &pgconn.ConnectError{}, saga.ClassOperator},
		{"plain error", errors.New("card declined"), saga.ClassStep},
		{"reset after sending", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, saga.ClassStep},
		{"marked by the step", saga.NeedsOperator(errors.New("quota file missing")), saga.ClassOperator},
		{"marked transient", saga.Transient(errors.New("busy")), saga.ClassTransient},
		{"permanent wins over the code", saga.Permanent(pg("42501")), saga.ClassStep},
		{"operator mark wins over permanent", saga.NeedsOperator(saga.Permanent(errors.New("x"))), saga.ClassOperator},
	} {
		if got := saga.Classify(c.err); got != c.want {
			t.Errorf("%s: Classify(%v) = %s, want %s", c.name, c.err, got, c.want)
		}
	}
}

// A step failing with errors an operator must fix is retried past its
// MaxAttempts and never compensated; it completes once the cause is fixed.
// A failure of the step's own (a CHECK violation) still compensates at once.
func TestRunnerHoldsOperatorErrorsAndCompensatesTheStepsOwn(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.exec(`CREATE TABLE accounts (id uuid PRIMARY KEY, balance int NOT NULL CHECK (balance >= 0))`)
	fast := saga.RetryPolicy{MaxAttempts: 2, Base: 20 * time.Millisecond, Max: 80 * time.Millisecond, Jitter: -1}

	// notes does not exist yet: 42P01 until the test creates it.
	writeNote := saga.TypedStep[trail]{
		Name: "note", Retry: fast,
		Do: func(ctx context.Context, s *trail, x *saga.StepTx) error {
			_, err := x.Tx.Exec(ctx, `INSERT INTO notes (instance_id) VALUES ($1)`, x.Instance.ID)
			return err
		},
		Compensate: compensateInto("note"),
	}
	// A participant that is not listening, then is.
	var listening atomic.Bool
	var calls atomic.Int64
	call := saga.TypedStep[trail]{
		Name: "call", Retry: fast,
		Do: func(ctx context.Context, s *trail, x *saga.StepTx) error {
			calls.Add(1)
			if !listening.Load() {
				return fmt.Errorf("post payments: %w", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})
			}
			return nil
		},
		Compensate: compensateInto("call"),
	}
	// Serialization failures three times over, with one attempt allowed.
	var conflicts atomic.Int64
	conflicted := saga.TypedStep[trail]{
		Name: "conflicted", Retry: saga.RetryPolicy{MaxAttempts: 1, Base: 10 * time.Millisecond, Max: 20 * time.Millisecond, Jitter: -1},
		Do: func(ctx context.Context, s *trail, x *saga.StepTx) error {
			if conflicts.Add(1) <= 3 {
				return &pgconn.PgError{Code: "40001", Message: "could not serialize access due to concurrent update"}
			}
			return nil
		},
		Compensate: compensateInto("conflicted"),
	}
	overdraw := saga.TypedStep[trail]{
		Name: "overdraw", Retry: fast,
		Do: func(ctx context.Context, s *trail, x *saga.StepTx) error {
			_, err := x.Tx.Exec(ctx, `INSERT INTO accounts (id, balance) VALUES ($1, -5)`, x.Instance.ID)
			return err
		},
	}
	held := typedDef("held-sql", effectStep("book"), writeNote)
	unreachable := typedDef("held-call", effectStep("book"), call)
	transient := typedDef("transient", effectStep("book"), conflicted)
	business := typedDef("business", effectStep("book"), overdraw)
	r.reg.MustRegister(held, unreachable, transient, business)
	r.run(nil, nil, nil)
	h, u := r.start(held, trail{}, 0), r.start(unreachable, trail{}, 0)
	tr, b := r.start(transient, trail{}, 0), r.start(business, trail{}, 0)

	r.wait(b, saga.StatusCompensated, 30*time.Second)
	if got := r.compOrder(b); !equal(got, []string{"book"}) {
		t.Fatalf("the CHECK violation compensated %v, want [book]", got)
	}
	r.wait(tr, saga.StatusCompleted, 30*time.Second)
	if got := r.compOrder(tr); len(got) != 0 {
		t.Fatalf("serialization failures compensated %v", got)
	}

	// Well past MaxAttempts (2): still RUNNING, nothing compensated.
	failures := func(id uuid.UUID) int {
		return r.count(`SELECT count(*) FROM saga_events WHERE instance_id = $1 AND kind = 'step_failed'`, id)
	}
	deadline := time.Now().Add(30 * time.Second)
	for failures(h) < 6 || failures(u) < 6 {
		if time.Now().After(deadline) {
			t.Fatalf("too few attempts: %d and %d\n%s", failures(h), failures(u), r.history(h))
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, id := range []uuid.UUID{h, u} {
		var status string
		var attempt int
		var heldSince *time.Time
		var lastErr string
		if err := r.db.Pool.QueryRow(context.Background(),
			`SELECT status::text, attempt, held_since, coalesce(last_error, '') FROM saga_instances WHERE id = $1`, id).
			Scan(&status, &attempt, &heldSince, &lastErr); err != nil {
			t.Fatal(err)
		}
		if status != "RUNNING" || attempt != 0 || heldSince == nil {
			t.Fatalf("instance %v: status %s, attempt %d, held_since %v (last error %q); want RUNNING, 0 attempts counted, held", id, status, attempt, heldSince, lastErr)
		}
		if n := r.count(`SELECT count(*) FROM comp_log WHERE instance_id = $1`, id); n != 0 {
			t.Fatalf("instance %v: %d compensations while held", id, n)
		}
	}

	// The operator fixes both causes: each completes, nothing compensated.
	r.exec(`CREATE TABLE notes (instance_id uuid PRIMARY KEY)`)
	listening.Store(true)
	for _, id := range []uuid.UUID{h, u} {
		inst := r.wait(id, saga.StatusCompleted, 30*time.Second)
		if inst.HeldSince != nil {
			t.Fatalf("instance %s completed still held since %v", inst.ID, inst.HeldSince)
		}
	}
	if n := r.count(`SELECT count(*) FROM comp_log WHERE instance_id IN ($1, $2)`, h, u); n != 0 {
		t.Fatalf("%d compensations of held instances", n)
	}
}
