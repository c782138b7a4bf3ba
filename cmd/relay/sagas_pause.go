package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/compensa/compensa/saga/admin"
)

// pauseAction is one of `relay sagas pause` and `relay sagas resume`: the
// same shape (an ID or --filter, a required --reason), two admin calls.
type pauseAction struct {
	name, short, long string
	one               func(*admin.Admin, context.Context, uuid.UUID, string, string) (admin.Result, error)
	bulk              func(*admin.Admin, context.Context, admin.BulkRequest) (admin.BulkResult, error)
	// done says what the instance does now, after the request.
	done string
}

var pauseActions = []pauseAction{{
	name:  "pause",
	short: "Pause a RUNNING or COMPENSATING instance: no step or compensation runs until resume",
	long: "Pause stops an instance where it stands: it becomes PAUSED and no relay claims it,\n" +
		"through restarts and failovers, until `relay sagas resume`. A runner in the middle\n" +
		"of a step loses its lease and cannot commit (the step runs again after the resume,\n" +
		"as after any lost lease). The step, attempt count, timers, wait and concurrency key\n" +
		"are kept: instances behind it under the same key keep waiting. A reply that comes\n" +
		"while it is paused is kept for it. The reason, the time and your user name are\n" +
		"journaled; pausing a PAUSED instance changes nothing.\n\n" +
		"With --filter instead of an ID it pauses every RUNNING or COMPENSATING instance the\n" +
		"filter matches, as relay sagas retry --filter retries them (a dry run without --yes).",
	one:  (*admin.Admin).Pause,
	bulk: (*admin.Admin).PauseMatching,
	done: "no relay runs it until it is resumed",
}, {
	name:  "resume",
	short: "Resume a PAUSED instance exactly where it stood",
	long: "Resume returns a PAUSED instance to the status it was paused in (RUNNING or\n" +
		"COMPENSATING), due when it was due: a wait or a reply timeout that passed while it\n" +
		"was paused applies at once, and a reply that came meanwhile is used. The reason,\n" +
		"the time and your user name are journaled.\n\n" +
		"With --filter instead of an ID it resumes every PAUSED instance the filter matches\n" +
		"(a dry run without --yes).",
	one:  (*admin.Admin).Resume,
	bulk: (*admin.Admin).ResumeMatching,
	done: "a runner picks it up when it is due",
}}

// newSagasPauseCmds builds `relay sagas pause` and `relay sagas resume`.
func newSagasPauseCmds(withAdmin func(*cobra.Command, func(*admin.Admin) error) error) []*cobra.Command {
	var cmds []*cobra.Command
	for _, act := range pauseActions {
		var reason string
		var bulk bulkFlags
		c := &cobra.Command{
			Use:   act.name + " {ID | --filter KEY=VALUE...} --reason TEXT [--yes | --dry-run]",
			Short: act.short,
			Long:  act.long,
			Args:  idOrFilter,
			RunE: func(cmd *cobra.Command, args []string) error {
				if strings.TrimSpace(reason) == "" {
					return usageError("--reason is required: say why you %s (it is journaled with your name)", act.name)
				}
				if err := plainReason(reason); err != nil {
					return err
				}
				if len(bulk.filters) > 0 || len(args) == 0 {
					return bulk.run(cmd, args, act.name, reason, withAdmin, act.bulk)
				}
				id, err := parseInstanceID(args[0])
				if err != nil {
					return err
				}
				return withAdmin(cmd, func(a *admin.Admin) error {
					res, err := act.one(a, cmd.Context(), id, reason, cliActor())
					if err != nil {
						return err
					}
					printPauseResult(cmd.OutOrStdout(), act, res)
					return nil
				})
			},
		}
		c.Flags().StringVar(&reason, "reason", "", "why (required; journaled)")
		bulk.register(c, act.name)
		cmds = append(cmds, c)
	}
	return cmds
}

func printPauseResult(out io.Writer, act pauseAction, res admin.Result) {
	it := res.Instance
	if res.AlreadyRequested {
		fmt.Fprintf(out, "%s is already %s at step %s; nothing changed\n", it.ID, it.Status, stepLabel(it.CurrentStep, it.CurrentStepName))
		return
	}
	fmt.Fprintf(out, "%sd: %s is now %s at step %s, attempt %d; %s\n",
		act.name, it.ID, it.Status, stepLabel(it.CurrentStep, it.CurrentStepName), it.Attempt, act.done)
}
