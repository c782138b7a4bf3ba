package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/compensa/compensa/internal/cliflag"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/admin"
	"github.com/compensa/compensa/saga/declare"
	"github.com/compensa/compensa/saga/pgjournal"
)

// newSagasCmd is `relay sagas`: the operator's commands, run against the
// database directly (no relay needs to be running) through saga/admin, the
// same code behind the HTTP API.
func newSagasCmd(opts *rootOptions) *cobra.Command {
	var stuckAfter, holdAfter time.Duration
	cmd := &cobra.Command{
		Use:   "sagas",
		Short: "List, inspect, retry, cancel, pause and resume saga instances (works without a running relay)",
		Long: "Operator commands on saga instances, against the database directly and with\n" +
			"the same semantics as the HTTP API (/v1/sagas): one implementation behind both.\n" +
			"Retry, cancel, pause and resume are journaled with your OS user name (cli:<user>)\n" +
			"and the time.",
	}
	cmd.PersistentFlags().Var(cliflag.PositiveDuration(&stuckAfter, admin.DefaultStuckAfter), "stuck-after",
		"a RUNNING or COMPENSATING instance whose next attempt is overdue by more than this, with no runner holding it, is stuck (env RELAY_STUCK_AFTER)")
	cmd.PersistentFlags().Var(cliflag.PositiveDuration(&holdAfter, admin.DefaultHoldAfter), "hold-after",
		"a RUNNING or COMPENSATING instance whose step has failed this long with errors an operator must fix (a missing grant, table or column, a connection failure) is stuck as held (env RELAY_HOLD_AFTER)")

	// withAdmin opens a small pool, runs f and closes the pool.
	withAdmin := func(cmd *cobra.Command, f func(a *admin.Admin) error) error {
		pool, err := openPool(cmd.Context(), opts, 2)
		if err != nil {
			return err
		}
		defer pool.Close()
		a, err := newSagaAdmin(cmd.Context(), pool, stuckAfter, holdAfter)
		if err != nil {
			return err
		}
		return f(a)
	}

	var (
		f      admin.Filter
		status string
		asJSON bool
	)
	list := &cobra.Command{
		Use:   "list",
		Short: "List saga instances, newest first (--stuck: only the stuck ones, with the reason)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f.Status = saga.Status(status)
			if err := f.Check(); err != nil {
				return usageError("%s", strings.TrimPrefix(err.Error(), saga.ErrInvalid.Error()+": "))
			}
			return withAdmin(cmd, func(a *admin.Admin) error {
				page, err := a.List(cmd.Context(), f)
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				if asJSON {
					var next *string
					if page.NextCursor != "" {
						next = &page.NextCursor
					}
					items := page.Items
					if items == nil {
						items = []admin.Item{}
					}
					return writeIndentedJSON(out, struct {
						Items      []admin.Item `json:"items"`
						NextCursor *string      `json:"next_cursor"`
					}{items, next})
				}
				printSagaItems(out, page.Items, f.Stuck)
				if page.NextCursor != "" {
					fmt.Fprintf(out, "\nmore: add --cursor %s\n", page.NextCursor)
				}
				return nil
			})
		},
	}
	lf := list.Flags()
	lf.BoolVar(&f.Stuck, "stuck", false, "only stuck instances (FAILED, held by an error an operator must fix, overdue with no runner, or an unregistered version)")
	lf.Var(cliflag.NewEnum(&status, "", "status", statusWords()...).Optional(), "status", "only this status: "+orList(statusWords()))
	lf.StringVar(&f.Saga, "saga", "", "only this saga (name)")
	lf.Var(cliflag.NewUUID(&f.Tenant), "tenant", "only this tenant")
	lf.Var(cliflag.IntBetween(&f.Limit, admin.DefaultLimit, 1, admin.MaxLimit), "limit", fmt.Sprintf("how many to show (1 to %d)", admin.MaxLimit))
	lf.StringVar(&f.Cursor, "cursor", "", "continue after the previous page (printed at its end)")
	lf.BoolVar(&asJSON, "json", false, `print {"items": [...], "next_cursor": ...} as the API does`)

	var showJSON bool
	show := &cobra.Command{
		Use:   "show ID",
		Short: "Show an instance: where it stands, its steps and its journal",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseInstanceID(args[0])
			if err != nil {
				return err
			}
			return withAdmin(cmd, func(a *admin.Admin) error {
				d, err := a.Show(cmd.Context(), id)
				if err != nil {
					return err
				}
				if showJSON {
					return writeIndentedJSON(cmd.OutOrStdout(), d)
				}
				printSagaDetail(cmd.OutOrStdout(), d)
				return nil
			})
		},
	}
	show.Flags().BoolVar(&showJSON, "json", false, "print the instance, its steps and its events as the API does")

	var retryReason, fromStep string
	var rerunEarlier bool
	var bulkRetry bulkFlags
	retry := &cobra.Command{
		Use:   "retry {ID [--from-step NAME [--rerun-earlier]] | --filter KEY=VALUE...} --reason TEXT [--yes]",
		Short: "Resume an instance exactly where it stands (never skips or marks a step done)",
		Long: "A FAILED instance goes back to COMPENSATING at the compensation that failed:\n" +
			"the runner re-runs it, then the compensations below it in reverse order. A stuck\n" +
			"RUNNING or COMPENSATING instance has its current step (or compensation) run now,\n" +
			"with its attempt count reset. No step is marked done and none is skipped. The\n" +
			"reason, the time and your user name are journaled. Asking again while a retry is\n" +
			"still pending changes nothing. COMPLETED, COMPENSATED and TIMED_OUT instances\n" +
			"cannot be retried.\n\n" +
			"With --from-step NAME a FAILED or COMPENSATED instance starts a new attempt at\n" +
			"step NAME: RUNNING again there, with its state and the earlier steps' outputs\n" +
			"kept. Refused when a step before NAME was compensated (its effect is undone;\n" +
			"--rerun-earlier starts from the first such step instead), and when a step from\n" +
			"NAME on completed and was never compensated (it would run twice).\n\n" +
			"With --filter instead of an ID it retries every instance the filter matches\n" +
			"(keys saga, version, status, step, stuck, error_contains, created_after,\n" +
			"created_before, tenant), each exactly as a single retry: without --yes it only\n" +
			"counts them and shows the first 20; with --yes it acts on at most --limit of them.",
		Args: idOrFilter,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(bulkRetry.filters) > 0 || len(args) == 0 {
				if fromStep != "" || rerunEarlier {
					return usageError("--from-step and --rerun-earlier take one instance ID, not --filter")
				}
				return bulkRetry.run(cmd, args, "retry", retryReason, withAdmin, (*admin.Admin).RetryMatching)
			}
			if rerunEarlier && fromStep == "" {
				return usageError("--rerun-earlier goes with --from-step NAME")
			}
			id, err := parseInstanceID(args[0])
			if err != nil {
				return err
			}
			if strings.TrimSpace(retryReason) == "" {
				return usageError("--reason is required: say why you retry (it is journaled with your name)")
			}
			if err := plainReason(retryReason); err != nil {
				return err
			}
			return withAdmin(cmd, func(a *admin.Admin) error {
				if fromStep != "" {
					res, err := a.RetryFromStep(cmd.Context(), admin.RestartRequest{ID: id, FromStep: fromStep, RerunEarlier: rerunEarlier, Reason: retryReason, Actor: cliActor()})
					if err != nil {
						return err
					}
					it := res.Instance
					fmt.Fprintf(cmd.OutOrStdout(), "restarted: %s is now %s at step %s; a runner picks it up at its next claim\n",
						it.ID, it.Status, stepLabel(it.CurrentStep, it.CurrentStepName))
					return nil
				}
				res, err := a.Retry(cmd.Context(), id, retryReason, cliActor())
				if err != nil {
					return err
				}
				printSagaResult(cmd.OutOrStdout(), "retry", res)
				return nil
			})
		},
	}
	retry.Flags().StringVar(&retryReason, "reason", "", "why (required; journaled)")
	retry.Flags().StringVar(&fromStep, "from-step", "", "a FAILED or COMPENSATED instance: start a new attempt at this step (its name)")
	retry.Flags().BoolVar(&rerunEarlier, "rerun-earlier", false, "with --from-step: when earlier steps were compensated, start from the first of them")
	bulkRetry.register(retry, "retry")

	var cancelReason string
	var bulkCancel bulkFlags
	cancel := &cobra.Command{
		Use:   "cancel {ID | --filter KEY=VALUE... --reason TEXT [--yes]}",
		Short: "Compensate a RUNNING instance: undo its done steps in reverse order",
		Long: "Cancel starts the compensation of a RUNNING instance. With --filter instead of\n" +
			"an ID it cancels every instance the filter matches, as relay sagas retry --filter\n" +
			"retries them (dry run without --yes; --reason required).",
		Args: idOrFilter,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(bulkCancel.filters) > 0 || len(args) == 0 {
				return bulkCancel.run(cmd, args, "cancel", cancelReason, withAdmin, (*admin.Admin).CancelMatching)
			}
			id, err := parseInstanceID(args[0])
			if err != nil {
				return err
			}
			if err := plainReason(cancelReason); err != nil {
				return err
			}
			return withAdmin(cmd, func(a *admin.Admin) error {
				res, err := a.Cancel(cmd.Context(), id, cancelReason, cliActor())
				if err != nil {
					return err
				}
				printSagaResult(cmd.OutOrStdout(), "cancel", res)
				return nil
			})
		},
	}
	cancel.Flags().StringVar(&cancelReason, "reason", "", "why (journaled; default "+fmt.Sprintf("%q", admin.DefaultCancelReason)+"; required with --filter)")
	bulkCancel.register(cancel, "cancel")

	viaAdmin := append([]*cobra.Command{list, show, retry, cancel}, newSagasPauseCmds(withAdmin)...)
	viaAdmin = append(viaAdmin, newSagasReplayCmd(withAdmin), newSagasUpgradeCmd(withAdmin))
	for _, c := range viaAdmin {
		// withAdmin connects to --database-url.
		opts.bindTo(c.Flags(), "database-url")
	}
	cmd.AddCommand(viaAdmin...)
	cmd.AddCommand(newSagasStartCmd(opts), newSagasValidateCmd(opts), newSagasTestCmd())
	return cmd
}

// statusWords are saga.Statuses as --status takes them.
func statusWords() []string {
	words := make([]string, len(saga.Statuses))
	for i, st := range saga.Statuses {
		words[i] = string(st)
	}
	return words
}

// newSagaAdmin builds the admin the way `relay run` does, with this binary's
// saga definitions, so that the CLI's view of "stuck" matches the API's.
func newSagaAdmin(ctx context.Context, pool *pgxpool.Pool, stuckAfter, holdAfter time.Duration) (*admin.Admin, error) {
	j, err := pgjournal.New(pool, nil)
	if err != nil {
		return nil, err
	}
	reg, err := registryFor(ctx, pool)
	if err != nil {
		return nil, err
	}
	// The declared sagas stored by any relay count as known: a retry or
	// cancel here is carried out by a relay that runs them.
	return admin.New(admin.Config{Pool: pool, Journal: j, Registry: declare.NewCatalog(reg, pool), StuckAfter: stuckAfter, HoldAfter: holdAfter})
}

func parseInstanceID(s string) (uuid.UUID, error) {
	id, err := uuid.Parse(s)
	if err != nil || len(s) != 36 {
		return uuid.Nil, usageError("%q is not a saga instance id (a UUID like 0b7e6c2a-1f0e-4a57-9a43-5d2c1e6f8b90)", s)
	}
	return id, nil
}

// cliActor names the person in the journal: cli:<OS user>.
func cliActor() string {
	name := ""
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	if name == "" {
		name = os.Getenv("USER")
	}
	if name == "" {
		name = "unknown"
	}
	return "cli:" + name
}

func writeIndentedJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

const sagaTimeLayout = "2006-01-02 15:04:05Z"

// journalTimeLayout shows journal entries to the millisecond: a saga's
// steps often take less than a second.
const journalTimeLayout = "2006-01-02 15:04:05.000Z"

func clipText(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

func stepLabel(i int, name string) string {
	if name == "" {
		return fmt.Sprint(i)
	}
	return fmt.Sprintf("%d %s", i, name)
}

func printSagaItems(out io.Writer, items []admin.Item, stuckOnly bool) {
	if len(items) == 0 {
		if stuckOnly {
			fmt.Fprintln(out, "nothing is stuck")
		} else {
			fmt.Fprintln(out, "no saga instances")
		}
		return
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSAGA\tSTATUS\tSTEP\tATTEMPT\tNEXT ATTEMPT\tSTUCK\tREASON")
	for _, it := range items {
		c := sagaListRow(it)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", c.ID, c.Saga, c.Status, c.Step, c.Attempt, c.NextAttempt, c.Stuck, c.Reason)
	}
	tw.Flush()
	if stuckOnly {
		fmt.Fprintln(out)
		for _, it := range items {
			fmt.Fprintf(out, "%s: %s\n", it.ID, it.StuckDetail)
		}
	}
}

// sagaRow is a list row's cells as people read them, in the CLI and on
// the monitor's page alike: a finished instance shows how it ended and no
// next attempt or attempt count, a reason is cut to ReasonWidth characters.
type sagaRow struct {
	ID, Saga, Status, Step, Attempt, NextAttempt, Stuck, Reason string
}

// ReasonWidth is how much of a reason a list row shows (the detail has it
// whole).
const reasonWidth = 60

func sagaListRow(it admin.Item) sagaRow {
	r := sagaRow{ID: it.ID.String(), Saga: fmt.Sprintf("%s@v%d", it.SagaName, it.SagaVersion), Status: string(it.Status),
		Step: it.StepSummary, Attempt: "-", NextAttempt: "-", Stuck: it.StuckReason, Reason: clipText(it.Reason, reasonWidth)}
	if !it.Terminal() && it.Status != saga.StatusFailed {
		r.Attempt = fmt.Sprint(it.Attempt)
		r.NextAttempt = it.NextAttemptAt.UTC().Format(sagaTimeLayout)
		if it.AwaitingReply {
			r.NextAttempt = "-"
		}
	}
	if r.Step == "" {
		r.Step = stepLabel(it.CurrentStep, it.CurrentStepName)
	}
	for _, c := range []*string{&r.Stuck, &r.Reason} {
		if *c == "" {
			*c = "-"
		}
	}
	return r
}

func sagaTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(sagaTimeLayout)
}

func printSagaDetail(out io.Writer, d admin.Detail) {
	in := d.Instance
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "instance\t%s\n", in.ID)
	fmt.Fprintf(tw, "saga\t%s version %d%s\n", in.SagaName, in.SagaVersion, map[bool]string{true: "", false: " (neither in this binary nor stored in saga_definitions)"}[d.Registered])
	fmt.Fprintf(tw, "tenant\t%s\n", in.TenantID)
	fmt.Fprintf(tw, "status\t%s\n", in.Status)
	if in.HistoryDeletedAt != nil {
		fmt.Fprintf(tw, "history\tdeleted by retention at %s: only this tombstone is kept, so that its trigger never starts it again\n", sagaTime(in.HistoryDeletedAt))
	}
	if in.StuckReason != "" {
		fmt.Fprintf(tw, "stuck\t%s: %s\n", in.StuckReason, in.StuckDetail)
	}
	row := sagaListRow(in.Item)
	if in.Terminal() {
		fmt.Fprintf(tw, "step\t%s\n", row.Step)
	} else {
		fmt.Fprintf(tw, "step\t%s (index %d), attempt %s\n", row.Step, in.CurrentStep, row.Attempt)
	}
	fmt.Fprintf(tw, "next attempt\t%s\n", row.NextAttempt)
	fmt.Fprintf(tw, "deadline\t%s\n", sagaTime(in.TimeoutAt))
	fmt.Fprintf(tw, "lease until\t%s\n", sagaTime(in.LeaseExpiresAt))
	if in.LastError != "" {
		fmt.Fprintf(tw, "last error\t%s\n", clipText(in.LastError, 200))
	}
	if in.CompensationReason != "" {
		fmt.Fprintf(tw, "compensating because\t%s\n", clipText(in.CompensationReason, 200))
	}
	fmt.Fprintf(tw, "created / updated\t%s / %s\n", in.CreatedAt.UTC().Format(sagaTimeLayout), in.UpdatedAt.UTC().Format(sagaTimeLayout))
	tw.Flush()

	fmt.Fprintln(out, "\nsteps:")
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  #\tNAME\tSTATUS\tATTEMPTS\tCOMP. ATTEMPTS\tCOMPLETED\tCOMPENSATED\tLAST ERROR")
	for _, s := range d.Steps {
		mark := " "
		if s.Sequence == in.CurrentStep {
			mark = ">"
		}
		fmt.Fprintf(tw, "%s %d\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", mark, s.Sequence, s.Name, s.Status, s.Attempts, s.CompensationAttempts,
			sagaTime(s.CompletedAt), sagaTime(s.CompensatedAt), clipText(s.LastError, 60))
	}
	tw.Flush()

	fmt.Fprintln(out, "\njournal:")
	if d.EventsTruncated {
		fmt.Fprintf(out, "  (only the newest %d events)\n", admin.MaxEvents)
	}
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  V\tTIME\tEVENT\tSTEP\tDETAILS")
	for _, e := range d.Events {
		step := "-"
		if e.Step != nil && *e.Step >= 0 {
			step = fmt.Sprint(*e.Step)
		}
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\n", e.Version, e.CreatedAt.UTC().Format(journalTimeLayout), e.Kind, step, sagaEventDetails(e.Payload))
	}
	tw.Flush()
}

// sagaEventDetails picks the fields of a journal payload a person reads first.
func sagaEventDetails(raw json.RawMessage) string {
	var ev saga.Event
	if json.Unmarshal(raw, &ev) != nil {
		return ""
	}
	var parts []string
	if ev.Reason != "" {
		parts = append(parts, "reason: "+clipText(ev.Reason, 80))
	}
	if ev.Actor != "" {
		parts = append(parts, "by "+ev.Actor)
	}
	if ev.Error != "" {
		parts = append(parts, "error: "+clipText(ev.Error, 80))
	}
	if ev.RetryIn > 0 {
		parts = append(parts, "retry in "+saga.RoundDelay(ev.RetryIn).String())
	}
	if !ev.Until.IsZero() {
		parts = append(parts, "until "+ev.Until.UTC().Format(time.RFC3339))
	}
	return strings.Join(parts, "; ")
}

func printSagaResult(out io.Writer, action string, res admin.Result) {
	it := res.Instance
	if res.AlreadyRequested {
		fmt.Fprintf(out, "%s already requested and still pending; nothing changed: %s is %s at step %s\n",
			action, it.ID, it.Status, stepLabel(it.CurrentStep, it.CurrentStepName))
		return
	}
	fmt.Fprintf(out, "%s requested: %s is now %s at step %s, attempt %d; a runner picks it up at its next claim\n",
		action, it.ID, it.Status, stepLabel(it.CurrentStep, it.CurrentStepName), it.Attempt)
}
