package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
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
			"exits 2; a valid set prints one line per saga. Warnings (an http step whose host\n" +
			"comes from an expression in a file without egress.allow) go to stderr and do not\n" +
			"change the exit code.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sagas, err := declare.LoadDir(args[0], declare.Options{})
			if err != nil {
				return problemsExit(cmd.ErrOrStderr(), err)
			}
			for _, s := range sagas {
				for _, w := range s.Warnings() {
					fmt.Fprintln(cmd.ErrOrStderr(), w.String())
				}
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

// newSagasTestCmd is `relay sagas test FILE --trigger TRIGGER.json`: walks a
// definition against a sample trigger without a database or network.
func newSagasTestCmd() *cobra.Command {
	var (
		trigger                 string
		replies, responses, rws []string
		fail                    string
	)
	cmd := &cobra.Command{
		Use:   "test FILE --trigger TRIGGER.json",
		Short: "Walk one saga definition against a sample trigger, without a database or network",
		Long: "Evaluates every expression of every step against the sample trigger and prints,\n" +
			"step by step, the SQL with its bound parameters, the HTTP request (secrets masked),\n" +
			"the command and the rows it would emit. --reply, --response and --rows give what a\n" +
			"step would get back (step=JSON, repeatable); --fail STEP shows the compensations\n" +
			"from that step, newest first. Exits 1 when an expression fails, naming its file:line.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			body, err := os.ReadFile(args[0])
			if err != nil {
				return exitError{code: 2, msg: fmt.Sprintf("%s: %v", args[0], err)}
			}
			s, probs := declare.LoadFile(args[0], body, declare.Options{})
			if probs != nil {
				return problemsExit(cmd.ErrOrStderr(), probs)
			}
			if trigger == "" {
				return exitError{code: 2, msg: "--trigger is required: a JSON file (or inline JSON) with the sample event, e.g. {\"event_type\": \"order.placed\", \"payload\": {…}}"}
			}
			in := declare.WalkInput{Fail: fail}
			if in.Trigger, err = jsonArg("--trigger", trigger); err != nil {
				return exitError{code: 2, msg: err.Error()}
			}
			for _, x := range []struct {
				flag string
				vals []string
				dst  *map[string]json.RawMessage
			}{{"--reply", replies, &in.Replies}, {"--response", responses, &in.Responses}, {"--rows", rws, &in.Rows}} {
				for _, v := range x.vals {
					step, raw, ok := strings.Cut(v, "=")
					if !ok || step == "" {
						return exitError{code: 2, msg: fmt.Sprintf("%s %q: write step=JSON, e.g. %s ship='{\"tracking\": \"T1\"}'", x.flag, v, x.flag)}
					}
					j, err := jsonArg(x.flag+" "+step, raw)
					if err != nil {
						return exitError{code: 2, msg: err.Error()}
					}
					if *x.dst == nil {
						*x.dst = map[string]json.RawMessage{}
					}
					(*x.dst)[step] = j
				}
			}
			if err := declare.Walk(s, in, cmd.OutOrStdout()); err != nil {
				return exitError{code: 1, msg: err.Error()}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&trigger, "trigger", "", "the sample trigger event: a JSON file, or inline JSON")
	f.StringArrayVar(&replies, "reply", nil, "step=JSON: the reply a command step gets (default {\"ok\": true})")
	f.StringArrayVar(&responses, "response", nil, "step=JSON: the response of an http step ({\"status\", \"headers\", \"body\"} or just the body)")
	f.StringArrayVar(&rws, "rows", nil, "step=JSON: the rows a sql step returns, a list of objects")
	f.StringVar(&fail, "fail", "", "the step that fails: shows the compensation path from it")
	return cmd
}

// jsonArg reads a JSON argument given inline or as a file name.
func jsonArg(what, v string) (json.RawMessage, error) {
	t := strings.TrimSpace(v)
	if t == "" {
		return nil, fmt.Errorf("%s is empty; give JSON or a JSON file", what)
	}
	if !strings.ContainsAny(t[:1], "{[\"0123456789-tfn") {
		b, err := os.ReadFile(v)
		if err != nil {
			return nil, fmt.Errorf("%s: %v; give JSON or a JSON file", what, err)
		}
		t = string(b)
	}
	if !json.Valid([]byte(t)) {
		// A file whose name starts like JSON (t.json) is read too.
		if b, err := os.ReadFile(v); err == nil && json.Valid(b) {
			return b, nil
		}
		return nil, fmt.Errorf("%s: not valid JSON; check the quoting", what)
	}
	return json.RawMessage(t), nil
}
