package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/migrations"
	"github.com/compensa/compensa/outbox"
)

func newMigrateCmd(opts *rootOptions) *cobra.Command {
	var withExamples, createSlot bool
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply the relay's schema migrations (idempotent)",
		Long: "Applies the embedded, numbered SQL migrations that are not yet recorded in\n" +
			"compensa_schema_migrations, under an advisory lock. Running it twice is a no-op.",
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
	cmd.Flags().BoolVar(&withExamples, "with-examples", false, "also apply the example application schema (research briefs) used by the demo")
	cmd.Flags().BoolVar(&createSlot, "create-slot", false, "also create the publication and the replication slot, so that nothing written after the migration is missed")
	return cmd
}
