package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/compensa/compensa/internal/cliflag"
	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/admin"
)

// bulkFlags are the flags of `relay sagas retry|cancel|pause|resume --filter ...`.
type bulkFlags struct {
	filters []string
	yes     bool
	dryRun  bool
	limit   int
	asJSON  bool
}

func (b *bulkFlags) register(cmd *cobra.Command, action string) {
	f := cmd.Flags()
	f.StringArrayVar(&b.filters, "filter", nil, "act on every instance matching KEY=VALUE (repeatable; keys saga, version, status, step, stuck, error_contains, created_after, created_before, tenant)")
	f.BoolVar(&b.yes, "yes", false, "really "+action+" (without it, --filter only counts and shows the first 20 ids)")
	f.BoolVar(&b.dryRun, "dry-run", false, "with --filter: only count and show the first 20 ids, change nothing (what --filter does without --yes)")
	f.Var(cliflag.IntBetween(&b.limit, admin.DefaultBulkLimit, 1, admin.MaxBulkLimit), "limit", fmt.Sprintf("with --filter --yes: act on at most this many instances (at most %d)", admin.MaxBulkLimit))
	f.BoolVar(&b.asJSON, "json", false, `with --filter: print the answer as the API does ({"dry_run", "matched", "sample" or "outcomes"})`)
}

// idOrFilter: retry and cancel take one instance ID, or none with --filter.
func idOrFilter(c *cobra.Command, args []string) error {
	if c.Flags().Changed("filter") {
		return cobra.NoArgs(c, args)
	}
	return cobra.ExactArgs(1)(c, args)
}

// parseBulkFilter reads KEY=VALUE pairs (also comma-separated) into a
// filter; the keys are the API's.
func parseBulkFilter(pairs []string) (admin.Filter, error) {
	var f admin.Filter
	seen := map[string]bool{}
	for _, arg := range pairs {
		for _, kv := range strings.Split(arg, ",") {
			k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
			if !ok || v == "" {
				return f, usageError("--filter %q: write KEY=VALUE, e.g. --filter saga=order --filter status=FAILED", kv)
			}
			if seen[k] {
				return f, usageError("--filter: %s is given twice", k)
			}
			seen[k] = true
			switch k {
			case "saga":
				f.Saga = v
			case "status":
				f.Status = saga.Status(strings.ToUpper(v))
			case "step":
				f.Step = v
			case "error_contains":
				f.ErrorContains = v
			case "version":
				n, err := strconv.Atoi(v)
				if err != nil || n < 1 {
					return f, usageError("--filter version=%s: want a positive integer", v)
				}
				f.Version = n
			case "stuck":
				bv, err := strconv.ParseBool(v)
				if err != nil {
					return f, usageError("--filter stuck=%s: want true or false", v)
				}
				f.Stuck = bv
			case "created_after", "created_before":
				t, err := time.Parse(time.RFC3339Nano, v)
				if err != nil {
					return f, usageError("--filter %s=%s: want an RFC 3339 time like 2026-01-02T15:04:05Z", k, v)
				}
				if k == "created_after" {
					f.CreatedAfter = t
				} else {
					f.CreatedBefore = t
				}
			case "tenant":
				id, err := uuid.Parse(v)
				if err != nil {
					return f, usageError("--filter tenant=%s: want a UUID", v)
				}
				f.Tenant = uuid.NullUUID{UUID: id, Valid: true}
			default:
				return f, usageError("--filter: unknown key %q; the keys are saga, version, status, step, stuck, error_contains, created_after, created_before, tenant", k)
			}
		}
	}
	return f, nil
}

func (b *bulkFlags) run(cmd *cobra.Command, args []string, action, reason string,
	withAdmin func(*cobra.Command, func(*admin.Admin) error) error,
	do func(*admin.Admin, context.Context, admin.BulkRequest) (admin.BulkResult, error)) error {
	if len(args) > 0 {
		return usageError("give an instance ID or --filter, not both")
	}
	if len(b.filters) == 0 {
		return usageError("give an instance ID, or --filter KEY=VALUE to %s every instance that matches", action)
	}
	if b.yes && b.dryRun {
		return usageError("--yes and --dry-run contradict each other: drop --dry-run to %s, or --yes to only count", action)
	}
	f, err := parseBulkFilter(b.filters)
	if err != nil {
		return err
	}
	if err := f.Check(); err != nil {
		return usageError("--filter: %s", strings.TrimPrefix(err.Error(), saga.ErrInvalid.Error()+": "))
	}
	if strings.TrimSpace(reason) == "" {
		return usageError("--reason is required with --filter: say why (it is journaled on every instance with your name)")
	}
	return withAdmin(cmd, func(a *admin.Admin) error {
		res, err := do(a, cmd.Context(), admin.BulkRequest{Filter: f, Reason: reason, Actor: cliActor(), DryRun: !b.yes, Limit: b.limit})
		if err != nil {
			return err
		}
		out := cmd.OutOrStdout()
		if b.asJSON {
			return writeIndentedJSON(out, res)
		}
		if res.DryRun {
			fmt.Fprintf(out, "%d instances match; %d can be %s, %d would be skipped (a %s cannot act on them); nothing was changed (dry run).\n",
				res.Matched, res.Applicable, pastTense(action), res.Skipped, action)
			for _, id := range res.Sample {
				fmt.Fprintf(out, "  %s\n", id)
			}
			if res.Applicable > int64(len(res.Sample)) {
				fmt.Fprintf(out, "  … and %d more\n", res.Applicable-int64(len(res.Sample)))
			}
			if res.Applicable > 0 {
				fmt.Fprintf(out, "Add --yes to %s them (at most --limit %d per run).\n", action, b.limit)
			}
			return nil
		}
		done := pastTense(action) // the outcome's key: retried, cancelled, paused, resumed
		fmt.Fprintf(out, "%d matched, %d skipped (a %s cannot act on them): %d %s, %d already requested, %d conflict (refused or changed meanwhile).\n",
			res.Matched, res.Skipped, action, res.Outcomes[done], done, res.Outcomes[admin.OutcomeAlreadyRequested], res.Outcomes[admin.OutcomeConflict])
		if left := res.Applicable - res.Outcomes[done] - res.Outcomes[admin.OutcomeAlreadyRequested] - res.Outcomes[admin.OutcomeConflict]; left > 0 {
			fmt.Fprintf(out, "%d more match: run the same command again.\n", left)
		}
		return nil
	})
}

func pastTense(action string) string {
	switch action {
	case "cancel":
		return "cancelled"
	case "retry":
		return "retried"
	}
	return action + "d"
}
