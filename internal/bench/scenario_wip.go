package bench

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The latency and steps scenarios need the PostgreSQL journal
// (saga/pgjournal), which is being written.
var errNeedsJournal = errors.New("needs saga/pgjournal, which is not in the tree yet")

func (r *run) latencyScenario(context.Context) error { return errNeedsJournal }
func (r *run) stepsScenario(context.Context) error   { return errNeedsJournal }

var _ *pgxpool.Pool
