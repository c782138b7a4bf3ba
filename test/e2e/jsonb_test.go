package e2e

import (
	"context"
	"testing"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/test/pgtest"
)

// outbox.CheckJSONB must agree with PostgreSQL: a payload it passes is
// accepted by ::jsonb (or the correlator's batch would fail on it), and one
// it refuses is refused (or a usable event would be parked).
func TestCheckJSONBAgreesWithPostgreSQL(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	cases := []string{
		`{}`, `{"a":"b"}`, `{"a":"\\u0000"}`, `{"e":"\ud83d\ude00"}`, `[1, -2.5e10, 0.000]`,
		`{"n": 123456789012345678901234567890}`, `"\u00e9"`, `{"z": 0e999}`, `{"z": 0e1001}`, `{"z": 0e-1001}`,
		`1e1000`, `1e1001`, `1e-1000`, `1e-1001`, `1.5e1000`, `12e999`, `0.01e1001`, `100e-1001`,
		`1e131071`, `1e-16383`, `1e200000`, `1e-20000`,
		`{"a":"x\u0000"}`, `{"a":"\ud800"}`, `{"a":"\udc00x"}`, `{"a":"\ud800\ud800"}`, `{"a":"\ud800a"}`,
		`{"a":"\ud800\u0041"}`,
	}
	for _, c := range cases {
		goErr := outbox.CheckJSONB([]byte(c))
		_, pgErr := db.Pool.Exec(ctx, `SELECT $1::text::jsonb`, c)
		if (goErr == nil) != (pgErr == nil) {
			t.Errorf("%s: CheckJSONB says %v, PostgreSQL says %v", c, goErr, pgErr)
		}
	}
}
