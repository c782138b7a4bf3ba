package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/compensa/compensa/internal/cliflag"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/admin"
	"github.com/compensa/compensa/saga/declare"
)

// newSagasReplayCmd is `relay sagas replay FILE|DIR`: the recorded journals
// against the definitions given, the check to run before deploying a new
// version.
func newSagasReplayCmd(withAdmin func(*cobra.Command, func(*admin.Admin) error) error) *cobra.Command {
	var req admin.ReplayRequest
	var asJSON bool
	c := &cobra.Command{
		Use:   "replay FILE|DIR [--saga NAME] [--version V] [--limit N]",
		Short: "Replay recorded journals against saga definitions; exit 1 when one diverges",
		Long: "Loads the saga definition files given (a file, or every *.yaml of a directory, as\n" +
			"relay sagas validate does) and replays the journals of recorded instances against\n" +
			"them: for each saga the newest version given is the candidate, and every instance\n" +
			"of that saga (finished and running; --version: only those that ran under V),\n" +
			"newest first, at most --limit, is checked. An instance diverges where its journal\n" +
			"ran a step the candidate does not have at that place, or names differently, or of\n" +
			"another kind (sql, http, command, wait, emit), or waited for a reply the\n" +
			"candidate's step does not ask for, or compensated a step the candidate cannot\n" +
			"compensate. Prints one line per instance and exits 1 when any diverges: run it in\n" +
			"CI against a copy of production's journal before deploying a new version. It reads\n" +
			"only (SELECT).",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			defs, err := loadDefinitions(args[0])
			if err != nil {
				return problemsExit(cmd.ErrOrStderr(), err)
			}
			return withAdmin(cmd, func(a *admin.Admin) error {
				res, err := a.Replay(cmd.Context(), defs, req)
				if err != nil {
					return err
				}
				diverged := 0
				for _, r := range res {
					if r.Divergence != "" {
						diverged++
					}
				}
				out := cmd.OutOrStdout()
				if asJSON {
					if err := writeIndentedJSON(out, map[string]any{"instances": res, "replayed": len(res), "diverged": diverged}); err != nil {
						return err
					}
				} else {
					for _, r := range res {
						verdict := "ok"
						if r.Divergence != "" {
							verdict = "DIVERGES: " + r.Divergence
						}
						fmt.Fprintf(out, "%s  %s v%d → v%d  %s  %d events  %s\n", r.InstanceID, r.Saga, r.Version, r.Against, r.Status, r.Events, verdict)
					}
					fmt.Fprintf(out, "%d instance(s) replayed, %d diverge\n", len(res), diverged)
				}
				if diverged > 0 {
					return exitError{code: 1, msg: fmt.Sprintf("%d of %d instance(s) diverge from the definitions given", diverged, len(res))}
				}
				return nil
			})
		},
	}
	c.Flags().StringVar(&req.Saga, "saga", "", "replay only the instances of this saga")
	c.Flags().Var(cliflag.IntAtLeast(&req.Version, 0, 0), "version", "replay only the instances that ran under this version (default: every version)")
	c.Flags().Var(cliflag.IntBetween(&req.Limit, admin.DefaultReplayLimit, 1, admin.MaxBulkLimit), "limit", fmt.Sprintf("replay at most this many instances, newest first (at most %d)", admin.MaxBulkLimit))
	c.Flags().BoolVar(&asJSON, "json", false, `print {"instances": [...], "replayed", "diverged"}`)
	return c
}

// loadDefinitions loads the declared sagas of a file or a directory as
// definitions that are never run.
func loadDefinitions(path string) ([]saga.Definition, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, usageError("%v", err)
	}
	var sagas []*declare.Saga
	if st.IsDir() {
		sagas, err = declare.LoadDir(path, declare.Options{})
		if err != nil {
			return nil, err
		}
	} else {
		body, err := os.ReadFile(path)
		if err != nil {
			return nil, usageError("%v", err)
		}
		s, probs := declare.LoadFile(path, body, declare.Options{})
		if probs != nil {
			return nil, probs
		}
		sagas = []*declare.Saga{s}
	}
	defs := make([]saga.Definition, len(sagas))
	for i, s := range sagas {
		defs[i] = s.Definition(nil)
	}
	return defs, nil
}

// newSagasUpgradeCmd is `relay sagas upgrade NAME --from-version A
// --to-version B`.
func newSagasUpgradeCmd(withAdmin func(*cobra.Command, func(*admin.Admin) error) error) *cobra.Command {
	var req admin.UpgradeRequest
	var asJSON bool
	c := &cobra.Command{
		Use:   "upgrade NAME --from-version A --to-version B [--dry-run] [--reason TEXT]",
		Short: "Move RUNNING and PAUSED instances of a saga to a newer version that can continue them",
		Long: "Moves the RUNNING and PAUSED instances of saga NAME from version A to version B\n" +
			"where B can continue their journal (what relay sagas replay checks: every step\n" +
			"they ran is the step B has at that place, of the same kind). A moved instance keeps\n" +
			"its step, state, timers and status and continues with B's later steps; the\n" +
			"compensations of the steps it ran are B's. Instances B cannot continue are listed\n" +
			"with the reason and stay on A, as do instances a runner is working on right now\n" +
			"(run the command again). B must be registered: loaded by a relay (relay run\n" +
			"--sagas, then SIGHUP) or defined in this binary. Each move is journaled with the\n" +
			"reason and your user name. --dry-run changes nothing and prints what would move.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req.Saga = args[0]
			if req.From < 1 || req.To < 1 {
				return usageError("--from-version and --to-version are required (versions start at 1)")
			}
			if req.From == req.To {
				return usageError("--from-version and --to-version are both %d: name the version to move to", req.From)
			}
			if err := plainReason(req.Reason); err != nil {
				return err
			}
			req.Actor = cliActor()
			return withAdmin(cmd, func(a *admin.Admin) error {
				res, err := a.Upgrade(cmd.Context(), req)
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				if asJSON {
					return writeIndentedJSON(out, res)
				}
				verb := "moved"
				if res.DryRun {
					verb = "would move"
				}
				for _, id := range res.Moved {
					fmt.Fprintf(out, "%s  %s v%d → v%d  %s\n", id, res.Saga, res.From, res.To, verb)
				}
				for _, r := range res.Refused {
					fmt.Fprintf(out, "%s  %s stays on v%d: %s\n", r.InstanceID, res.Saga, res.From, r.Reason)
				}
				fmt.Fprintf(out, "%d instance(s) %s from v%d to v%d, %d refused", len(res.Moved), verb, res.From, res.To, len(res.Refused))
				if res.DryRun {
					fmt.Fprint(out, "; nothing was changed (dry run)")
				}
				fmt.Fprintln(out)
				return nil
			})
		},
	}
	c.Flags().Var(cliflag.IntAtLeast(&req.From, 0, 1), "from-version", "the version the instances run now (required)")
	c.Flags().Var(cliflag.IntAtLeast(&req.To, 0, 1), "to-version", "the version to move them to (required; registered)")
	c.Flags().BoolVar(&req.DryRun, "dry-run", false, "change nothing: print what would move and what would not, and why")
	c.Flags().StringVar(&req.Reason, "reason", "", "why (journaled; default names the versions)")
	c.Flags().Var(cliflag.IntBetween(&req.Limit, admin.DefaultBulkLimit, 1, admin.MaxBulkLimit), "limit", fmt.Sprintf("move at most this many instances per run (at most %d)", admin.MaxBulkLimit))
	c.Flags().BoolVar(&asJSON, "json", false, "print the answer as the API does")
	return c
}
