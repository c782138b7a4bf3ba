package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/compensa/compensa/internal/cliflag"
	"github.com/compensa/compensa/saga/admin"
)

// newSagasStartCmd is `relay sagas start NAME`: the CLI twin of
// POST /v1/sagas, through the same admin.Start.
func newSagasStartCmd(opts *rootOptions) *cobra.Command {
	var (
		payloadFile, aggregateID, key string
		tenant                        uuid.NullUUID
		asJSON                        bool
	)
	cmd := &cobra.Command{
		Use:   "start NAME [--payload FILE] [--aggregate-id ID] [--idempotency-key KEY]",
		Short: "Start a saga by hand: write its trigger event to the outbox",
		Long: "Writes the trigger event of saga NAME (its newest version's first trigger: event\n" +
			"type and aggregate type) into --outbox-table with the payload of FILE (\"-\" reads\n" +
			"standard input; none: {}). The relay starts the instance when it streams the event,\n" +
			"exactly as it starts any other: once per trigger event. The same --idempotency-key\n" +
			"for the same saga and tenant names the same event, so it never starts twice while\n" +
			"the relay keeps the instance or its tombstone (--dedupe-window after it ended).\n" +
			"Every saga that the event's type triggers starts, as for an event your service writes.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := admin.StartRequest{Saga: args[0], AggregateID: aggregateID, IdempotencyKey: key}
			if tenant.Valid {
				req.TenantID = tenant.UUID
			}
			if payloadFile != "" {
				var b []byte
				var err error
				if payloadFile == "-" {
					b, err = io.ReadAll(io.LimitReader(cmd.InOrStdin(), 1<<20))
				} else {
					b, err = os.ReadFile(payloadFile)
				}
				if err != nil {
					return exitError{code: 2, msg: "--payload: " + err.Error()}
				}
				if !json.Valid(b) {
					return exitError{code: 2, msg: fmt.Sprintf("--payload %s is not JSON; write the trigger event's payload as a JSON object", payloadFile)}
				}
				req.Payload = b
			}
			pool, err := openPool(cmd.Context(), opts, 2)
			if err != nil {
				return err
			}
			defer pool.Close()
			a, err := newSagaAdmin(cmd.Context(), pool, admin.DefaultStuckAfter, admin.DefaultHoldAfter)
			if err != nil {
				return err
			}
			res, err := a.Start(cmd.Context(), opts.OutboxTable, req)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return writeIndentedJSON(out, res)
			}
			switch {
			case res.InstanceID != nil:
				fmt.Fprintf(out, "already started: instance %s (trigger event %s)\n", res.InstanceID, res.EventID)
			case !res.Created:
				fmt.Fprintf(out, "already written: trigger event %s (%s); the relay starts %s when it streams it\n", res.EventID, res.EventType, res.Saga)
			default:
				fmt.Fprintf(out, "written: trigger event %s (%s); the relay starts %s when it streams it\n", res.EventID, res.EventType, res.Saga)
			}
			if res.InstanceID == nil {
				fmt.Fprintf(out, "find it with: relay sagas list --saga %s (or search %s on the monitor)\n", res.Saga, strings.ToLower(res.EventID.String()))
			}
			return nil
		},
	}
	opts.bindTo(cmd.Flags(), "database-url", "outbox-table")
	f := cmd.Flags()
	f.StringVar(&payloadFile, "payload", "", "a file holding the trigger event's payload, a JSON object (\"-\": standard input; none: {})")
	f.StringVar(&aggregateID, "aggregate-id", "", "the trigger event's aggregate id")
	f.StringVar(&key, "idempotency-key", "", "the same key never starts the saga twice (per saga and tenant, within the relay's --dedupe-window)")
	f.Var(cliflag.NewUUID(&tenant), "tenant", "the trigger event's tenant")
	f.BoolVar(&asJSON, "json", false, "print the result as POST /v1/sagas answers it")
	return cmd
}
