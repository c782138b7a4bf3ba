package migrations

import "context"

// ApplyThrough is Apply for the core migrations up to and including
// version: a database as an earlier release left it, for the upgrade tests.
func ApplyThrough(ctx context.Context, db Conn, version int) error {
	ms, err := List(Options{})
	if err != nil {
		return err
	}
	if _, err := ensureTable(ctx, db); err != nil {
		return err
	}
	for _, m := range ms {
		if m.Version > version {
			break
		}
		if _, err := applyOne(ctx, db, m, Options{}); err != nil {
			return err
		}
	}
	return nil
}
