package relay

import (
	"context"
	"fmt"
	"strings"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/migrations"
	"github.com/compensa/compensa/outbox"
)

// PrivilegeError is what New returns when the role lacks privileges the
// Config's features need: every missing one, each as a line that names it,
// what needs it and the statement that grants it. It matches ErrPrivilege,
// and ErrReplicationPrivilege too when the REPLICATION attribute is among
// them.
type PrivilegeError struct {
	Role    string
	Missing []string
	// replication is set when the role may not stream.
	replication bool
}

func (e *PrivilegeError) Error() string {
	return fmt.Sprintf("role %q lacks %d privilege(s) relay run needs:\n%s", e.Role, len(e.Missing), strings.Join(e.Missing, "\n"))
}

func (e *PrivilegeError) Unwrap() []error {
	if e.replication {
		return []error{ErrPrivilege, ErrReplicationPrivilege}
	}
	return []error{ErrPrivilege}
}

// features is what the Config turns on, for the privilege check.
func (c Config) features() []migrations.Feature {
	fs := []migrations.Feature{migrations.FeatureRunner}
	if !c.NoStream {
		fs = append(fs, migrations.FeatureStream)
		if c.OutboxRetention > 0 {
			fs = append(fs, migrations.FeatureRetention)
		}
		if c.Sinks != "" {
			fs = append(fs, migrations.FeatureSinks)
		}
	}
	if c.janitorOn() {
		fs = append(fs, migrations.FeatureHistoryRetention)
	}
	if c.Sagas != "" {
		fs = append(fs, migrations.FeatureSagas)
	}
	if c.APIToken != "" || c.APITokensFile != "" {
		fs = append(fs, migrations.FeatureAPI)
	}
	return fs
}

// checkPrivileges reads, before anything runs, every privilege the Config's
// features need, and returns them all at once when some are missing.
func (r *Relay) checkPrivileges(ctx context.Context, table outbox.TableName) error {
	if !r.cfg.NoStream {
		if err := cdc.CheckWALLevel(ctx, r.pool); err != nil {
			return err
		}
	}
	var role string
	if err := r.pool.QueryRow(ctx, `SELECT current_user`).Scan(&role); err != nil {
		return fmt.Errorf("relay: read the current role: %w", err)
	}
	want, err := migrations.Required(ctx, r.pool, table.Quoted(), r.cfg.features()...)
	if err != nil {
		return err
	}
	lack, err := migrations.Lacking(ctx, r.pool, role, want)
	if err != nil {
		return err
	}
	pe := &PrivilegeError{Role: role}
	for _, p := range lack {
		pe.Missing = append(pe.Missing, p.Missing(role))
	}
	if !r.cfg.NoStream {
		ok, fix, err := cdc.ReplicationPrivilege(ctx, r.pool, role)
		if err != nil {
			return err
		}
		if !ok {
			pe.replication = true
			pe.Missing = append(pe.Missing, fmt.Sprintf("missing privilege: REPLICATION, for %s (run: %s relay migrate --grant-to %s does it when run by a superuser; or run this replica with --no-stream)",
				migrations.FeatureStream, fix, role))
		}
	}
	if len(pe.Missing) > 0 {
		return pe
	}
	return nil
}
