package correlator

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// A lost connection (the server restarted, the network broke) is told apart
// from a batch the database refused: only the first resets the pool.
func TestConnectionLost(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}, true},
		{fmt.Errorf("correlator: begin: %w", &pgconn.PgError{Code: "08006"}), true},
		{fmt.Errorf("commit: %w", io.ErrUnexpectedEOF), true},
		{errors.New("commit: failed to deallocate cached statement(s): conn closed"), true},
		{&pgconn.ConnectError{}, true},
		{&pgconn.PgError{Code: "23505"}, false},
		{&pgconn.PgError{Code: "22P02"}, false},
		{errors.New("correlator: the batch is empty"), false},
	} {
		if got := connectionLost(c.err); got != c.want {
			t.Errorf("connectionLost(%v) = %t, want %t", c.err, got, c.want)
		}
	}
}
