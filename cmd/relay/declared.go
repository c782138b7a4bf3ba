package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/compensa/compensa/internal/cliflag"
	"github.com/compensa/compensa/saga/declare"
)

// newSagasValidateCmd is `relay sagas validate DIR`: loads every definition
// file as relay run --sagas would, without a database; with --database-url
// it also compares them with the stored (pinned) versions, as a reload would.
func newSagasValidateCmd(opts *rootOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "validate DIR",
		Short: "Check the saga definition files of DIR (exit 2 on any error); --database-url: against the stored versions too",
		Long: "Loads every *.yaml and *.yml file of DIR as relay run --sagas does: YAML, the JSON\n" +
			"Schema (saga/declare/saga.schema.json), CEL expressions, step references. Prints\n" +
			"every problem, one per line, as file:line:col: what is wrong; how to fix it, and\n" +
			"exits 2; a valid set prints one line per saga. Warnings (an http step whose host\n" +
			"comes from an expression in a file without egress.allow) go to stderr and do not\n" +
			"change the exit code.\n\n" +
			"Without --database-url it needs no database. With --database-url (given on the\n" +
			"command line; the environment's is not used) it also reads saga_definitions and\n" +
			"reports what relay run would refuse at start or reload: a saga whose name and\n" +
			"version are stored with another body, or a stored version that unfinished\n" +
			"instances still need and that no longer loads. It stores nothing (SELECT only).",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sagas, err := declare.LoadDir(args[0], declare.Options{})
			tests, terr := declare.LoadTests(args[0])
			if err != nil || terr != nil {
				return problemsExit(cmd.ErrOrStderr(), errors.Join(err, terr))
			}
			for _, s := range sagas {
				for _, w := range s.Warnings() {
					fmt.Fprintln(cmd.ErrOrStderr(), w.String())
				}
			}
			stored := ""
			if cmd.Flags().Changed("database-url") {
				pool, err := openPool(cmd.Context(), opts, 1)
				if err != nil {
					return err
				}
				defer pool.Close()
				if err := declare.CheckStored(cmd.Context(), pool, sagas); err != nil {
					return problemsExit(cmd.ErrOrStderr(), err)
				}
				stored = " (checked against the stored versions)"
			}
			printSagas(cmd.OutOrStdout(), sagas)
			if stored != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "%d saga(s) agree with saga_definitions%s\n", len(sagas), stored)
			}
			for _, tf := range tests {
				fmt.Fprintf(cmd.OutOrStdout(), "%s: %d test case(s) for %s (run them with relay sagas test %s)\n", tf.File, len(tf.Cases), tf.Saga, args[0])
			}
			return nil
		},
	}
	opts.bindTo(cmd.Flags(), "database-url")
	return cmd
}

// problemsExit prints load problems one per line and returns exit code 2.
func problemsExit(w io.Writer, err error) error {
	var all declare.Problems
	var other []error
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	for _, e := range errs {
		var ps declare.Problems
		if errors.As(e, &ps) {
			all = append(all, ps...)
		} else if e != nil {
			other = append(other, e)
		}
	}
	if len(other) > 0 {
		return exitError{code: 2, msg: errors.Join(other...).Error()}
	}
	for _, p := range all {
		fmt.Fprintln(w, p.String())
	}
	return exitError{code: 2, msg: fmt.Sprintf("%d problem(s) in the saga files; nothing was run", len(all))}
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
			if st.When != nil {
				k += ", when"
			}
			if st.Compensate != nil {
				k += ", compensate " + st.Compensate.Kind()
			}
			steps = append(steps, st.Name+" ("+k+")")
		}
		fmt.Fprintf(w, "%s v%d  triggers: %s  steps: %s\n", s.Name, s.Version, strings.Join(trig, ", "), strings.Join(steps, " → "))
	}
}

// newSagasTestCmd is `relay sagas test`: walks a definition against a
// sample trigger (FILE --trigger), or runs the test files of a directory
// (DIR), without a database or network.
func newSagasTestCmd() *cobra.Command {
	var (
		trigger                 string
		replies, responses, rws map[string]string
		fail, expect            string
	)
	cmd := &cobra.Command{
		Use:   "test {FILE --trigger TRIGGER.json | DIR}",
		Short: "Walk a saga as the runner would, or run the test files of DIR, without a database or network",
		Long: "FILE --trigger: evaluates every expression of every step against the sample trigger\n" +
			"as the runner would run it and prints, step by step, the SQL with its bound\n" +
			"parameters, the HTTP request (secrets masked), the command and the rows it would\n" +
			"emit. --reply, --response and --rows give what a step gets back (step=JSON,\n" +
			"repeatable; --response step=422:JSON answers with a status). A step fails as at run\n" +
			"time (a failing expression, a sql result that misses its expect, a non-2xx answer,\n" +
			"a failed reply, --fail STEP) and the compensations follow, newest first; the\n" +
			"trigger's schema and filter apply first. It ends with COMPLETED, COMPENSATED,\n" +
			"FAILED, FILTERED or DEAD_LETTER; --expect STATUS exits 1 on another.\n\n" +
			"DIR: runs every case of the test files of DIR (*.test.yaml, see\n" +
			"saga/declare/sagatest.schema.json) against the sagas of DIR, prints PASS or FAIL\n" +
			"per case with what differs, and exits 1 when a case fails.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if fi, err := os.Stat(args[0]); err == nil && fi.IsDir() {
				if trigger != "" || fail != "" || expect != "" || len(replies)+len(responses)+len(rws) > 0 {
					return exitError{code: 2, msg: "with a directory, the cases come from its *.test.yaml files: drop --trigger, --reply, --response, --rows, --fail and --expect"}
				}
				return runSagaTests(cmd, args[0])
			}
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
				vals map[string]string
				dst  *map[string]json.RawMessage
			}{{"--reply", replies, &in.Replies}, {"--response", responses, &in.Responses}, {"--rows", rws, &in.Rows}} {
				for _, step := range slices.Sorted(maps.Keys(x.vals)) {
					raw := x.vals[step]
					if x.flag == "--response" {
						raw = statusResponse(raw)
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
			res, err := declare.Walk(s, in, cmd.OutOrStdout())
			if err != nil {
				return exitError{code: 1, msg: err.Error()}
			}
			if expect != "" && res.Status != expect {
				return exitError{code: 1, msg: fmt.Sprintf("--expect %s, but the saga ends %s: %s", expect, res.Status, res.Reason)}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&trigger, "trigger", "", "the sample trigger event: a JSON file, or inline JSON")
	f.Var(stepJSON(&replies, "--reply"), "reply", "the reply a command step gets (default {\"ok\": true}; repeatable)")
	f.Var(stepJSON(&responses, "--response"), "response", "the response of an http step: {\"status\", \"headers\", \"body\"}, just the body, or STATUS:JSON (repeatable)")
	f.Var(stepJSON(&rws, "--rows"), "rows", "the rows a sql step returns, a list of objects, or a number: the rows a statement without RETURNING affects (repeatable)")
	f.StringVar(&fail, "fail", "", "the step that fails for good: shows the compensation path from it")
	outcomes := []string{declare.WalkCompleted, declare.WalkCompensated, declare.WalkFailed, declare.WalkFiltered, declare.WalkDeadLetter}
	f.Var(cliflag.NewEnum(&expect, "", "outcome", outcomes...).Optional(), "expect", "the outcome the walk must end with ("+strings.Join(outcomes, ", ")+"): exit 1 on another")
	return cmd
}

// stepJSON is a --reply, --response or --rows flag: STEP=JSON per step,
// the JSON (or the file holding it) read when the walk starts.
func stepJSON(m *map[string]string, flag string) *cliflag.Pairs[string, string] {
	return cliflag.NewPairs(m, "STEP=JSON", "want STEP=JSON, e.g. "+flag+" ship='{\"tracking\": \"T1\"}'",
		func(step, raw string) (string, string, bool) { return step, raw, true })
}

// statusResponse turns 422:{"error": "declined"} into {"status": 422,
// "body": {"error": "declined"}}; anything else is left as it is.
func statusResponse(raw string) string {
	code, body, ok := strings.Cut(raw, ":")
	if !ok || len(code) != 3 || strings.Trim(code, "0123456789") != "" {
		return raw
	}
	if strings.TrimSpace(body) == "" {
		body = "{}"
	}
	if !json.Valid([]byte(body)) {
		return raw // reported as not JSON, as given
	}
	return `{"status": ` + code + `, "body": ` + body + `}`
}

// runSagaTests runs the test files of dir against its sagas.
func runSagaTests(cmd *cobra.Command, dir string) error {
	sagas, err := declare.LoadDir(dir, declare.Options{})
	if err != nil {
		return problemsExit(cmd.ErrOrStderr(), err)
	}
	files, err := declare.LoadTests(dir)
	if err != nil {
		return problemsExit(cmd.ErrOrStderr(), err)
	}
	if len(files) == 0 {
		return exitError{code: 2, msg: fmt.Sprintf("%s holds no test file (*%s); write one per saga (see saga/declare/sagatest.schema.json)", dir, declare.TestFileSuffix)}
	}
	passed, failed := declare.RunTests(cmd.OutOrStdout(), sagas, files)
	fmt.Fprintf(cmd.OutOrStdout(), "%d passed, %d failed\n", passed, failed)
	if failed > 0 {
		return exitError{code: 1, msg: fmt.Sprintf("%d of %d case(s) failed", failed, passed+failed)}
	}
	return nil
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
