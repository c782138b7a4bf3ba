package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/compensa/compensa/migrations"
)

func newMigrateCmd(opts *rootOptions) *cobra.Command {
	var withExamples bool
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply the relay's schema migrations (idempotent)",
		Long: "Applies the embedded, numbered SQL migrations that are not yet recorded in\n" +
			"compensa_schema_migrations, under an advisory lock. Running it twice is a no-op.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			conn, err := connect(ctx, opts)
			if err != nil {
				return err
			}
			defer conn.Close(ctx)
			ran, err := migrations.Apply(ctx, conn, migrations.Options{WithExamples: withExamples})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if len(ran) == 0 {
				fmt.Fprintln(out, "schema is up to date")
				return nil
			}
			for _, m := range ran {
				fmt.Fprintf(out, "applied %s %04d_%s\n", m.Set, m.Version, m.Name)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&withExamples, "with-examples", false, "also apply the example application schema (research briefs) used by the demo")
	return cmd
}
