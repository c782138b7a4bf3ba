package correlator_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
)

// Exactly-once starts rest on the schema, not on the correlator's SQL: after
// migration 0007 one unique index (trigger_event_id, saga_name) must refuse a
// second instance of a saga for one trigger event, in the same version or in
// another, from any writer, while other sagas triggered by the same event
// still start.
func TestTheSchemaRefusesASecondStartOfOneTrigger(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	trig := uuid.New()
	insert := func(name string, version int) error {
		_, err := b.db.Pool.Exec(ctx, `INSERT INTO saga_instances (tenant_id, saga_name, saga_version, trigger_event_id)
			VALUES ($1, $2, $3, $4)`, uuid.Nil, name, version, trig)
		return err
	}
	if err := insert("brief_enrichment", 1); err != nil {
		t.Fatal(err)
	}
	for _, version := range []int{1, 2} {
		err := insert("brief_enrichment", version)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
			t.Fatalf("second start of the trigger in version %d: err %v, want a unique violation", version, err)
		}
	}
	if err := insert("audit", 1); err != nil {
		t.Fatalf("another saga on the same trigger: %v", err)
	}
	if n := b.count(t, `SELECT count(*) FROM saga_instances WHERE trigger_event_id = $1`, trig); n != 2 {
		t.Fatalf("%d instances for the trigger, want 2 (one per saga)", n)
	}
}
