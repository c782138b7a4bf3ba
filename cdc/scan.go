package cdc

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/outbox"
)

// OutboxRange selects outbox rows by their created_at (Since inclusive,
// Until exclusive; a zero Until means no upper bound) and, optionally, their
// aggregate type.
type OutboxRange struct {
	Since, Until  time.Time
	AggregateType string
}

// ScanOutbox reads the outbox rows still in the table that r selects, in
// created_at order, then by writing transaction and insertion order, decoded as the stream decodes them, and
// hands them to fn a page of at most pageSize at a time. Each page is its
// own short query (keyset pagination), so a long scan holds no snapshot or
// lock that the stream or the producers would wait on. It returns how many
// rows it read. The table needs its created_at column.
func ScanOutbox(ctx context.Context, q Querier, table outbox.TableName, cols outbox.ColumnMap, r OutboxRange, pageSize int, fn func([]outbox.Event) error) (int, error) {
	t, err := inspectTable(ctx, q, &Config{Table: table, Columns: cols})
	if err != nil {
		return 0, err
	}
	created := t.fieldCol[fCreatedAt]
	if created == "" {
		return 0, errorf(ErrOutboxColumn, "reading the outbox by time needs the created_at column of %s", t.quoted())
	}
	if pageSize < 1 {
		pageSize = 1000
	}
	// Qualified, so that ORDER BY names the table's columns, not the
	// selected ones of the same name.
	c := t.quoted() + "." + pgx.Identifier{created}.Sanitize()
	base, fields, typ := selectColumns(t)
	// The order, and the cursor: created_at, then the writing transaction
	// (xmin), then the row's position in the table (ctid), which is the
	// order a transaction inserted its rows in (outbox rows are never
	// updated).
	tq := t.quoted()
	order := c + ", " + tq + ".xmin::text::bigint, " + tq + ".ctid"
	base = strings.TrimSuffix(base, " FROM "+tq) + ", " + c + ", " + tq + ".xmin::text::bigint, " + tq + ".ctid::text FROM " + tq
	aggCol := "NULL::text"
	if a := t.fieldCol[fAggregateType]; a != "" {
		aggCol = tq + "." + pgx.Identifier{a}.Sanitize()
	}
	where := " WHERE " + c + " >= $1 AND ($2::timestamptz IS NULL OR " + c + " < $2)" +
		" AND ($3::text IS NULL OR " + aggCol + " = $3)" +
		" AND ($4::timestamptz IS NULL OR (" + order + ") > ($4, $5::bigint, $6::text::tid))"
	sql := base + where + " ORDER BY " + order + " LIMIT " + fmt.Sprint(pageSize)
	var until, aggType, afterAt, afterXmin, afterTid any
	if !r.Until.IsZero() {
		until = r.Until
	}
	if r.AggregateType != "" {
		if t.fieldCol[fAggregateType] == "" {
			return 0, errorf(ErrOutboxColumn, "filtering by aggregate type needs the aggregate_type column of %s", t.quoted())
		}
		aggType = r.AggregateType
	}
	total := 0
	for {
		rows, err := q.Query(ctx, sql, r.Since, until, aggType, afterAt, afterXmin, afterTid)
		if err != nil {
			return total, fmt.Errorf("cdc: read the outbox table %s: %w", t.quoted(), err)
		}
		var page []outbox.Event
		for rows.Next() {
			raw := rows.RawValues()
			var row [nFields]value
			for k, f := range fields {
				row[f] = value{present: true, null: raw[k] == nil, data: append([]byte(nil), raw[k]...)}
			}
			page = append(page, buildEvent(&row, &typ, nil, 0))
			var at time.Time
			var xmin int64
			var tid string
			if err := rows.Scan(append(make([]any, len(fields)), &at, &xmin, &tid)...); err != nil {
				rows.Close()
				return total, fmt.Errorf("cdc: read the outbox table %s: %w", t.quoted(), err)
			}
			afterAt, afterXmin, afterTid = at, xmin, tid
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return total, fmt.Errorf("cdc: read the outbox table %s: %w", t.quoted(), err)
		}
		if len(page) == 0 {
			return total, nil
		}
		total += len(page)
		if err := fn(page); err != nil {
			return total, err
		}
		if len(page) < pageSize {
			return total, nil
		}
	}
}
