package main

import (
	"context"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5"

	"github.com/spf13/cobra"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/migrations"
	"github.com/compensa/compensa/outbox"
)

func newMigrateCmd(opts *rootOptions) *cobra.Command {
	var withExamples, createSlot bool
	var grantTo []string
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply the relay's schema migrations (idempotent)",
		Long: "Applies the embedded, numbered SQL migrations that are not yet recorded in\n" +
			"compensa_schema_migrations, under an advisory lock. Running it twice is a no-op.\n" +
			"With --grant-to ROLE it then grants ROLE what `relay run` needs for every feature\n" +
			"(tables, the sequences behind their serial columns, the schema; no CREATE, no\n" +
			"ownership), creates the publication when it is missing, and gives ROLE the\n" +
			"REPLICATION attribute when the migrating role may (otherwise it prints the statement).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			table, err := outbox.ParseTableName(opts.OutboxTable)
			if err != nil {
				return fmt.Errorf("--outbox-table: %w", err)
			}
			cols, err := outbox.ParseColumnMap(opts.OutboxColumns)
			if err != nil {
				return err
			}
			conn, err := connect(ctx, opts)
			if err != nil {
				return err
			}
			defer conn.Close(ctx)
			// An outbox of the application's own: the default table is
			// neither created nor altered.
			custom := opts.OutboxColumns != "" || table.Name != "outbox" || (table.Schema != "" && table.Schema != "public")
			ran, err := migrations.Apply(ctx, conn, migrations.Options{WithExamples: withExamples, CustomOutbox: custom})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if len(ran) == 0 {
				fmt.Fprintln(out, "schema is up to date")
			}
			for _, m := range ran {
				fmt.Fprintf(out, "applied %s %04d_%s\n", m.Set, m.Version, m.Name)
			}
			for _, role := range grantTo {
				if err := grantRole(ctx, out, conn, role, table, cdc.Config{DatabaseURL: opts.DatabaseURL, Slot: opts.Slot,
					Publication: opts.Publication, Table: table, Columns: cols}); err != nil {
					return err
				}
			}
			if !createSlot {
				return nil
			}
			if err := cdc.Setup(ctx, conn, cdc.Config{DatabaseURL: opts.DatabaseURL, Slot: opts.Slot,
				Publication: opts.Publication, Table: table, Columns: cols}); err != nil {
				return err
			}
			fmt.Fprintf(out, "publication %s and slot %s are in place: outbox rows committed from now on will be streamed\n",
				opts.Publication, opts.Slot)
			return nil
		},
	}
	opts.bindTo(cmd.Flags(), "database-url", "slot", "publication", "outbox-table", "outbox-columns")
	cmd.Flags().BoolVar(&withExamples, "with-examples", false, "also apply the example application schema (research briefs) used by the demo")
	cmd.Flags().StringArrayVar(&grantTo, "grant-to", nil, "after migrating, grant this role what relay run needs (repeatable; idempotent)")
	cmd.Flags().BoolVar(&createSlot, "create-slot", false, "also create the publication and the replication slot, so that nothing written after the migration is missed")
	return cmd
}

// grantRole grants role what `relay run` needs, creates the publication the
// role cannot create itself, and gives it REPLICATION when the migrating
// role may; what is left to a superuser or the table's owner is printed
// with its statement.
func grantRole(ctx context.Context, out io.Writer, conn *pgx.Conn, role string, table outbox.TableName, cfg cdc.Config) error {
	ran, err := migrations.GrantTo(ctx, conn, role, table.Quoted())
	for _, st := range ran {
		fmt.Fprintln(out, st)
	}
	if err != nil {
		return err
	}
	if len(ran) == 0 {
		fmt.Fprintf(out, "role %s already has every privilege relay run needs\n", role)
	}
	if created, err := cdc.EnsurePublication(ctx, conn, cfg); err != nil {
		fmt.Fprintf(out, "note: %v\n", err)
	} else if created {
		fmt.Fprintf(out, "created publication %s for the outbox table\n", cfg.Publication)
	}
	ok, fix, err := cdc.ReplicationPrivilege(ctx, conn, role)
	if err != nil || ok {
		return err
	}
	var super bool
	if err := conn.QueryRow(ctx, `SELECT rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&super); err != nil {
		return err
	}
	if super {
		st := "ALTER ROLE " + pgx.Identifier{role}.Sanitize() + " REPLICATION;"
		if _, err := conn.Exec(ctx, st); err != nil {
			return fmt.Errorf("%s: %w", st, err)
		}
		fmt.Fprintln(out, st)
		return nil
	}
	fmt.Fprintf(out, "note: role %s lacks REPLICATION, which the stream needs (replicas run with --no-stream do not); %s\n", role, fix)
	return nil
}
