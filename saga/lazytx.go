package saga

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// lazyTx is the transaction a forward step sees (StepTx.Tx): it begins the
// real transaction on the step's first use of the database. A step that
// writes nothing through it never opens one, and its journal entry goes to
// the journal alone, which (pgjournal) sends BEGIN with its locking read and
// COMMIT with its write: two round trips for the step instead of four, with
// the same fence. Once begun it is the real transaction, and what the step
// wrote commits with its journal entry as before.
type lazyTx struct {
	begin func(ctx context.Context) (pgx.Tx, error)
	tx    pgx.Tx
	err   error
}

var _ pgx.Tx = (*lazyTx)(nil)

func (l *lazyTx) get(ctx context.Context) (pgx.Tx, error) {
	if l.tx == nil && l.err == nil {
		l.tx, l.err = l.begin(ctx)
	}
	return l.tx, l.err
}

// rollback ends the real transaction, if one was begun.
func (l *lazyTx) rollback() {
	if l.tx != nil {
		rollback(l.tx)
	}
}

func (l *lazyTx) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Begin(ctx)
}

// Commit and Rollback belong to the runner (see StepTx.Tx): a step that
// ended its transaction would commit its writes without its journal entry.
func (l *lazyTx) Commit(context.Context) error {
	return Errorf(ErrInvalid, "a step must not commit its transaction: the runner commits it with the step's journal entry")
}

func (l *lazyTx) Rollback(context.Context) error {
	return Errorf(ErrInvalid, "a step must not roll back its transaction: return an error from Do instead")
}

func (l *lazyTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	tx, err := l.get(ctx)
	if err != nil {
		return 0, err
	}
	return tx.CopyFrom(ctx, table, cols, src)
}

func (l *lazyTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	tx, err := l.get(ctx)
	if err != nil {
		return errBatch{err}
	}
	return tx.SendBatch(ctx, b)
}

// LargeObjects and Conn take no context: they begin under a background one.
// A failed begin leaves the zero LargeObjects and a nil Conn; the next
// statement reports the error.
func (l *lazyTx) LargeObjects() pgx.LargeObjects {
	tx, err := l.get(context.Background())
	if err != nil {
		return pgx.LargeObjects{}
	}
	return tx.LargeObjects()
}

func (l *lazyTx) Conn() *pgx.Conn {
	tx, err := l.get(context.Background())
	if err != nil {
		return nil
	}
	return tx.Conn()
}

func (l *lazyTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	tx, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Prepare(ctx, name, sql)
}

func (l *lazyTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tx, err := l.get(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return tx.Exec(ctx, sql, args...)
}

func (l *lazyTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	tx, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Query(ctx, sql, args...)
}

func (l *lazyTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	tx, err := l.get(ctx)
	if err != nil {
		return errRow{err}
	}
	return tx.QueryRow(ctx, sql, args...)
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRow(b) }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) Tx() pgx.Tx                       { return nil }
