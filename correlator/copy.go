package correlator

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/cdc"
	"github.com/compensa/compensa/outbox"
)

// copyStarts is the smallest number of plain, unkeyed starts that a batch
// sends as COPY rather than as sqlStart. COPY spares PostgreSQL the unnest
// of eleven arrays and the projection of each row, inserts a page's worth of
// rows per heap WAL record, and its binary rows cost the relay less to
// encode than pgx's arrays; but it is a round trip of its own, while
// sqlStart rides in the batch's pipeline, so a small batch (the latency
// path) keeps the INSERT.
const copyStarts = 256

// copyStartColumns is the number of columns sqlCopyStart names.
const copyStartColumns = 12

// pgEpoch is where PostgreSQL's binary timestamps count from.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// copyHeader is the start of COPY's binary format: signature, flags and
// an empty header extension.
func copyHeader(b []byte) []byte {
	b = append(b, "PGCOPY\n\xff\r\n\x00"...)
	b = binary.BigEndian.AppendUint32(b, 0)
	return binary.BigEndian.AppendUint32(b, 0)
}

// copyTrailer ends COPY's binary format.
func copyTrailer(b []byte) []byte { return binary.BigEndian.AppendUint16(b, 0xFFFF) }

// copyRows encodes the plan's starts from the from-th on in COPY's binary
// format, appending to b. now is the transaction's now(), which sqlStart
// would have read on the server: next_attempt_at is now and timeout_at now
// plus the saga's deadline, so both forms store the same instant.
func copyRows(b []byte, p *plan, from int, now time.Time) []byte {
	us := now.Sub(pgEpoch).Microseconds()
	field := func(v []byte) { b = binary.BigEndian.AppendUint32(b, uint32(len(v))); b = append(b, v...) }
	null := func() { b = binary.BigEndian.AppendUint32(b, 0xFFFFFFFF) }
	text := func(s string) { b = binary.BigEndian.AppendUint32(b, uint32(len(s))); b = append(b, s...) }
	int8 := func(v int64) {
		b = binary.BigEndian.AppendUint32(b, 8)
		b = binary.BigEndian.AppendUint64(b, uint64(v))
	}
	for i := from; i < len(p.startSaga); i++ {
		b = binary.BigEndian.AppendUint16(b, copyStartColumns)
		field(p.startID[i][:])
		field(p.startTenant[i][:])
		if w := p.startWorkspace[i]; w != nil {
			field(w[:])
		} else {
			null()
		}
		text(p.startSaga[i])
		b = binary.BigEndian.AppendUint32(b, 4)
		b = binary.BigEndian.AppendUint32(b, uint32(p.startVersion[i]))
		field(p.startTrigger[i][:])
		if c := p.startCorr[i]; c != nil {
			field(c[:])
		} else {
			null()
		}
		// jsonb's binary form: a version byte, then the JSON text, which
		// the server parses as it would the text sqlStart casts.
		b = binary.BigEndian.AppendUint32(b, uint32(1+len(p.startContext[i])))
		b = append(b, 1)
		b = append(b, p.startContext[i]...)
		if d := p.startDeadline[i]; d > 0 {
			int8(us + d)
		} else {
			null()
		}
		int8(us)
		if a := p.startAggregate[i]; a != nil {
			text(*a)
		} else {
			null()
		}
		if t := p.startTrace[i]; t != nil {
			text(*t)
		} else {
			null()
		}
	}
	return b
}

// copyStart starts the plan's instances with COPY in tx: every one of them,
// or an error (a trigger started before fails it on saga_trigger_once_uq,
// as it fails sqlStart).
func copyStart(ctx context.Context, tx pgx.Tx, p *plan, now time.Time) error {
	b := copyTrailer(copyRows(copyHeader(make([]byte, 0, 256*len(p.startSaga))), p, 0, now))
	tag, err := tx.Conn().PgConn().CopyFrom(ctx, bytes.NewReader(b), sqlCopyStart)
	if err != nil {
		return err
	}
	if tag.RowsAffected() != int64(len(p.startSaga)) {
		return fmt.Errorf("%d instances copied for %d starts", tag.RowsAffected(), len(p.startSaga))
	}
	return nil
}

// planChunk is how many events are planned and encoded at a time while a
// streamed COPY runs: about 50 kB of rows, what pgconn sends in one message.
const planChunk = 256

// errCopyEnded stops the planner's writes once the COPY has ended early
// (PostgreSQL refused a row): the planner still plans the rest of the batch,
// which a retry needs.
var errCopyEnded = errors.New("correlator: the COPY of starts ended")

// streamStarts plans b's events into p while the COPY of their starts runs:
// events are planned a chunk at a time and each chunk's start rows are sent
// while the next chunk is planned, so the relay's planning and encoding
// overlap PostgreSQL's inserting instead of preceding it. It returns once
// the COPY has ended and p holds the whole batch's plan, whatever the
// outcome, so that a retry (the guarded start, the parking of refused
// values) can use it. Only an unkeyed registry's batches stream: a start
// with a concurrency key needs sqlStartKeyed's columns (routes.keyed).
func streamStarts(ctx context.Context, tx pgx.Tx, r routes, b cdc.Batch, p *plan, now time.Time) error {
	pr, pw := io.Pipe()
	planned := make(chan struct{})
	p.reserve(len(b.Events))
	go func() {
		defer close(planned)
		buf := copyHeader(nil)
		var werr error
		sent := 0
		for i := range b.Events {
			p.add(r, &b.Events[i])
			if (i+1)%planChunk != 0 && i+1 != len(b.Events) {
				continue
			}
			buf = copyRows(buf, p, sent, now)
			sent = len(p.startSaga)
			if i+1 == len(b.Events) {
				buf = copyTrailer(buf)
			}
			if werr == nil {
				_, werr = pw.Write(buf)
			}
			buf = buf[:0]
		}
		pw.CloseWithError(werr)
	}()
	tag, err := tx.Conn().PgConn().CopyFrom(ctx, pr, sqlCopyStart)
	pr.CloseWithError(errCopyEnded)
	<-planned
	if err != nil {
		return err
	}
	if tag.RowsAffected() != int64(len(p.startSaga)) {
		return fmt.Errorf("%d instances copied for %d starts", tag.RowsAffected(), len(p.startSaga))
	}
	return nil
}

// keyed reports whether a saga routed to has a concurrency key.
func (r routes) keyed() bool {
	for _, rs := range r {
		for _, rt := range rs {
			if c := rt.def.Concurrency; c != nil && c.Key != nil {
				return true
			}
		}
	}
	return false
}

// triggers reports whether at least n of evs have an event type some saga
// is triggered by (filters aside): a batch worth streaming its starts.
func (r routes) triggers(evs []outbox.Event, n int) bool {
	if len(evs) < n {
		return false
	}
	for i := range evs {
		if _, ok := r[evs[i].EventType]; ok {
			if n--; n == 0 {
				return true
			}
		}
	}
	return false
}
