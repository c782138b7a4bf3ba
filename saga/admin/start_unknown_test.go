package admin_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/admin"
)

// An unknown saga's message names the sagas that are known and points to
// what exists: GET /v1/definitions, never a command the CLI lacks.
func TestStartUnknownSagaNamesTheKnownOnes(t *testing.T) {
	// The pool never connects: Start refuses before any statement.
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	reg := saga.NewRegistry()
	reg.MustRegister(threeSteps("order", 1), threeSteps("invoice", 1))
	adm, err := admin.New(admin.Config{Pool: pool, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	_, err = adm.Start(context.Background(), "outbox", admin.StartRequest{Saga: "ordr"})
	if !errors.Is(err, saga.ErrNotFound) {
		t.Fatalf("err = %v, want ErrNotFound", err)
	}
	msg := err.Error()
	for _, want := range []string{`"ordr"`, "known: invoice, order", "GET /v1/definitions"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	if strings.Contains(msg, "relay sagas definitions") {
		t.Errorf("message %q names a command that does not exist", msg)
	}
}
