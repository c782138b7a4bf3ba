package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/compensa/compensa/saga/declare"
)

// newSagasValidateCmd is `relay sagas validate DIR`: loads every definition
// file as relay run --sagas would, without a database.
func newSagasValidateCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "validate DIR",
		Short: "Check the saga definition files of DIR without a database (exit 2 on any error)",
		Long: "Loads every *.yaml and *.yml file of DIR as relay run --sagas does: YAML, the JSON\n" +
			"Schema (saga/declare/saga.schema.json), CEL expressions, step references. Prints\n" +
			"every problem, one per line, as file:line:col: what is wrong; how to fix it, and\n" +
			"exits 2; a valid set prints one line per saga.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sagas, err := declare.LoadDir(args[0], declare.Options{})
			if err != nil {
				return problemsExit(cmd.ErrOrStderr(), err)
			}
			printSagas(cmd.OutOrStdout(), sagas)
			return nil
		},
	}
}

// problemsExit prints load problems one per line and returns exit code 2.
func problemsExit(w io.Writer, err error) error {
	var ps declare.Problems
	if errors.As(err, &ps) {
		for _, p := range ps {
			fmt.Fprintln(w, p.String())
		}
		return exitError{code: 2, msg: fmt.Sprintf("%d problem(s) in the saga definitions; nothing was started", len(ps))}
	}
	return exitError{code: 2, msg: err.Error()}
}

// printSagas prints one line per saga: name, version, triggers, steps.
func printSagas(w io.Writer, sagas []*declare.Saga) {
	for _, s := range sagas {
		var trig, steps []string
		for _, t := range s.Triggers {
			x := t.EventType
			if t.AggregateType != "" {
				x += " (" + t.AggregateType + ")"
			}
			trig = append(trig, x)
		}
		for _, st := range s.Steps {
			k := st.Kind()
			if st.Compensate != nil {
				k += ", compensate " + st.Compensate.Kind()
			}
			steps = append(steps, st.Name+" ("+k+")")
		}
		fmt.Fprintf(w, "%s v%d  triggers: %s  steps: %s\n", s.Name, s.Version, strings.Join(trig, ", "), strings.Join(steps, " → "))
	}
}
