package correlator

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// copyStarts is the smallest number of plain, unkeyed starts that a batch
// sends as COPY rather than as sqlStart. COPY spares PostgreSQL the unnest
// of eleven arrays and the projection of each row, inserts a page's worth of
// rows per heap WAL record, and its binary rows cost the relay less to
// encode than pgx's arrays; but it is a round trip of its own, while
// sqlStart rides in the batch's pipeline, so a small batch (the latency
// path) keeps the INSERT.
const copyStarts = 256

// sqlCopyStart is the COPY that the rows of copyRows feed: the columns of
// sqlStart, in the same order.
const sqlCopyStart = `COPY saga_instances (id, tenant_id, workspace_id, saga_name, saga_version, trigger_event_id,
  correlation_id, context, timeout_at, next_attempt_at, trigger_aggregate_id, traceparent) FROM STDIN (FORMAT binary)`

// copyStartColumns is the number of columns sqlCopyStart names.
const copyStartColumns = 12

// pgEpoch is where PostgreSQL's binary timestamps count from.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// copyRows encodes the plan's starts in COPY's binary format. now is the
// transaction's now(), which sqlStart would have read on the server:
// next_attempt_at is now and timeout_at now plus the saga's deadline, so
// both forms store the same instant.
func copyRows(p *plan, now time.Time) []byte {
	n := len(p.startSaga)
	size := 19 + 2
	for i := range n {
		size += 2 + copyStartColumns*4 + 16*5 + 4 + 8 + 8 + 1 + len(p.startSaga[i]) + len(p.startContext[i])
		if a := p.startAggregate[i]; a != nil {
			size += len(*a)
		}
		if t := p.startTrace[i]; t != nil {
			size += len(*t)
		}
	}
	b := make([]byte, 0, size)
	b = append(b, "PGCOPY\n\xff\r\n\x00"...)
	b = binary.BigEndian.AppendUint32(b, 0) // flags
	b = binary.BigEndian.AppendUint32(b, 0) // header extension
	us := now.Sub(pgEpoch).Microseconds()
	field := func(v []byte) { b = binary.BigEndian.AppendUint32(b, uint32(len(v))); b = append(b, v...) }
	null := func() { b = binary.BigEndian.AppendUint32(b, 0xFFFFFFFF) }
	text := func(s string) { b = binary.BigEndian.AppendUint32(b, uint32(len(s))); b = append(b, s...) }
	int8 := func(v int64) {
		b = binary.BigEndian.AppendUint32(b, 8)
		b = binary.BigEndian.AppendUint64(b, uint64(v))
	}
	for i := range n {
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
	return binary.BigEndian.AppendUint16(b, 0xFFFF)
}

// copyStart starts the plan's instances with COPY in tx: every one of them,
// or an error (a trigger started before fails it on saga_trigger_once_uq,
// as it fails sqlStart).
func copyStart(ctx context.Context, tx pgx.Tx, p *plan, now time.Time) error {
	tag, err := tx.Conn().PgConn().CopyFrom(ctx, bytes.NewReader(copyRows(p, now)), sqlCopyStart)
	if err != nil {
		return err
	}
	if tag.RowsAffected() != int64(len(p.startSaga)) {
		return fmt.Errorf("%d instances copied for %d starts", tag.RowsAffected(), len(p.startSaga))
	}
	return nil
}
