package admin

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/saga"
)

// Overview is the state of all instances at a glance. Every part comes from
// a bounded query (see sql.go), so that it stays fast with millions of
// instances: counts from maintained totals, the series and durations from
// the last hour's rows by index, errors from the instances that can still
// move.
type Overview struct {
	GeneratedAt time.Time `json:"generated_at"`
	// Sagas: per saga and version, instances by status (only statuses
	// with instances).
	Sagas []SagaCounts `json:"sagas"`
	// PerMinute: the last 60 minutes, oldest first, every minute present.
	PerMinute []MinuteCounts `json:"per_minute"`
	// Durations of the instances that completed in the last hour.
	Durations []Durations `json:"durations"`
	// TopErrors: the most frequent (saga, step, normalised message) of the
	// instances that are FAILED, RUNNING or COMPENSATING with an error.
	TopErrors []ErrorGroup `json:"top_errors"`
	// ErrorsSampled: at least MaxErrorRows such instances exist; the
	// counts are of MaxErrorRows of them.
	ErrorsSampled bool `json:"errors_sampled"`
}

// SagaCounts is one saga version's instances by status.
type SagaCounts struct {
	Saga     string           `json:"saga"`
	Version  int              `json:"version"`
	ByStatus map[string]int64 `json:"by_status"`
	Total    int64            `json:"total"`
}

// MinuteCounts is one minute of the last hour.
type MinuteCounts struct {
	Minute      time.Time `json:"minute"`
	Started     int64     `json:"started"`
	Completed   int64     `json:"completed"`
	Compensated int64     `json:"compensated"`
	Failed      int64     `json:"failed"`
}

// Durations is the created→completed time of one saga version's instances
// that completed in the last hour.
type Durations struct {
	Saga       string  `json:"saga"`
	Version    int     `json:"version"`
	Completed  int64   `json:"completed"`
	P50Seconds float64 `json:"p50_seconds"`
	P99Seconds float64 `json:"p99_seconds"`
}

// ErrorGroup is one kind of error: instances at the same step whose last
// errors differ only in ids and numbers.
type ErrorGroup struct {
	Saga     string `json:"saga"`
	Version  int    `json:"version"`
	Step     int    `json:"step"`
	StepName string `json:"step_name,omitempty"`
	// Message has UUIDs masked as <id> and numbers as <n>.
	Message string `json:"message"`
	Count   int64  `json:"count"`
	// Link is the page's list of these instances (filtered by saga,
	// version, step and the message's longest literal part).
	Link string `json:"link"`
}

// Bounds of the overview.
const (
	// MaxErrorRows bounds how many erroring instances TopErrors reads.
	MaxErrorRows = 10000
	// TopErrorGroups is how many error groups the overview lists.
	TopErrorGroups = 10
)

// Overview computes the overview (within the scope, if any). It folds
// pending count changes into the totals first (CompactCounts).
func (a *Admin) Overview(ctx context.Context) (Overview, error) {
	if _, err := a.CompactCounts(ctx); err != nil {
		return Overview{}, err
	}
	tx, err := a.cfg.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return Overview{}, fmt.Errorf("admin: overview: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var o Overview
	if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&o.GeneratedAt); err != nil {
		return Overview{}, fmt.Errorf("admin: overview: %w", err)
	}

	rows, err := tx.Query(ctx, sqlOverviewCounts, a.scope)
	if err != nil {
		return Overview{}, fmt.Errorf("admin: overview counts: %w", err)
	}
	index := map[string]int{}
	err = forEach(rows, func(r pgx.Rows) error {
		var name, status string
		var version int
		var n int64
		if err := r.Scan(&name, &version, &status, &n); err != nil {
			return err
		}
		key := fmt.Sprintf("%s\x00%d", name, version)
		i, ok := index[key]
		if !ok {
			i = len(o.Sagas)
			index[key] = i
			o.Sagas = append(o.Sagas, SagaCounts{Saga: name, Version: version, ByStatus: map[string]int64{}})
		}
		o.Sagas[i].ByStatus[status] = n
		o.Sagas[i].Total += n
		return nil
	})
	if err != nil {
		return Overview{}, fmt.Errorf("admin: overview counts: %w", err)
	}

	rows, err = tx.Query(ctx, sqlOverviewPerMinute, a.scope)
	if err != nil {
		return Overview{}, fmt.Errorf("admin: overview per minute: %w", err)
	}
	err = forEach(rows, func(r pgx.Rows) error {
		var m MinuteCounts
		if err := r.Scan(&m.Minute, &m.Started, &m.Completed, &m.Compensated, &m.Failed); err != nil {
			return err
		}
		o.PerMinute = append(o.PerMinute, m)
		return nil
	})
	if err != nil {
		return Overview{}, fmt.Errorf("admin: overview per minute: %w", err)
	}

	rows, err = tx.Query(ctx, sqlOverviewDurations, a.scope)
	if err != nil {
		return Overview{}, fmt.Errorf("admin: overview durations: %w", err)
	}
	err = forEach(rows, func(r pgx.Rows) error {
		var d Durations
		if err := r.Scan(&d.Saga, &d.Version, &d.Completed, &d.P50Seconds, &d.P99Seconds); err != nil {
			return err
		}
		o.Durations = append(o.Durations, d)
		return nil
	})
	if err != nil {
		return Overview{}, fmt.Errorf("admin: overview durations: %w", err)
	}

	rows, err = tx.Query(ctx, sqlOverviewErrors, a.scope, MaxErrorRows)
	if err != nil {
		return Overview{}, fmt.Errorf("admin: overview errors: %w", err)
	}
	groups := map[ErrorGroup]int64{}
	read := 0
	err = forEach(rows, func(r pgx.Rows) error {
		var g ErrorGroup
		var msg string
		if err := r.Scan(&g.Saga, &g.Version, &g.Step, &msg); err != nil {
			return err
		}
		read++
		g.Message = NormaliseError(msg)
		groups[g]++
		return nil
	})
	if err != nil {
		return Overview{}, fmt.Errorf("admin: overview errors: %w", err)
	}
	o.ErrorsSampled = read >= MaxErrorRows
	for g, n := range groups {
		g.Count = n
		o.TopErrors = append(o.TopErrors, g)
	}
	sort.Slice(o.TopErrors, func(i, j int) bool {
		x, y := o.TopErrors[i], o.TopErrors[j]
		if x.Count != y.Count {
			return x.Count > y.Count
		}
		return fmt.Sprint(x.Saga, x.Version, x.Step, x.Message) < fmt.Sprint(y.Saga, y.Version, y.Step, y.Message)
	})
	if len(o.TopErrors) > TopErrorGroups {
		o.TopErrors = o.TopErrors[:TopErrorGroups]
	}
	for i := range o.TopErrors {
		g := &o.TopErrors[i]
		g.StepName = a.stepName(g.Saga, g.Version, g.Step)
		g.Link = errorLink(*g)
	}
	if o.Sagas == nil {
		o.Sagas = []SagaCounts{}
	}
	if o.Durations == nil {
		o.Durations = []Durations{}
	}
	if o.TopErrors == nil {
		o.TopErrors = []ErrorGroup{}
	}
	return o, nil
}

func forEach(rows pgx.Rows, f func(pgx.Rows) error) error {
	defer rows.Close()
	for rows.Next() {
		if err := f(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// CompactCounts folds the pending status-count changes into the totals and
// returns how many totals changed. Any number of relays may call it at
// once: while one folds, the others skip (the totals read the same either
// way, since a reader adds the pending changes).
func (a *Admin) CompactCounts(ctx context.Context) (int64, error) {
	var n int64
	err := pgx.BeginFunc(ctx, a.cfg.Pool, func(tx pgx.Tx) error {
		var mine bool
		if err := tx.QueryRow(ctx, sqlCompactLock).Scan(&mine); err != nil || !mine {
			return err
		}
		tag, err := tx.Exec(ctx, sqlCompactCounts)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("admin: compact status counts: %w", err)
	}
	return n, nil
}

var masked = regexp.MustCompile(`<id>|<n>`)

// NormaliseError masks what differs between instances failing the same
// way: UUIDs become <id>, runs of digits <n>.
func NormaliseError(msg string) string {
	var b strings.Builder
	b.Grow(len(msg))
	for i := 0; i < len(msg); {
		if isUUIDAt(msg, i) {
			b.WriteString("<id>")
			i += 36
			continue
		}
		if c := msg[i]; c >= '0' && c <= '9' {
			for i < len(msg) && msg[i] >= '0' && msg[i] <= '9' {
				i++
			}
			b.WriteString("<n>")
			continue
		}
		b.WriteByte(msg[i])
		i++
	}
	return b.String()
}

// isUUIDAt reports whether a UUID (8-4-4-4-12 hex digits) starts at s[i].
func isUUIDAt(s string, i int) bool {
	if len(s)-i < 36 {
		return false
	}
	for j := 0; j < 36; j++ {
		c := s[i+j]
		switch j {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
				return false
			}
		}
	}
	return true
}

// errorLink is the page's list of an error group's instances. The filter
// keeps the message's longest literal part: the masked parts differ from
// instance to instance.
func errorLink(g ErrorGroup) string {
	q := url.Values{}
	q.Set("saga", g.Saga)
	q.Set("version", fmt.Sprint(g.Version))
	if g.StepName != "" {
		q.Set("step", g.StepName)
	}
	longest := ""
	for _, part := range masked.Split(g.Message, -1) {
		if part = strings.TrimSpace(part); len(part) > len(longest) {
			longest = part
		}
	}
	if longest != "" {
		q.Set("error_contains", longest)
	}
	return "/?" + q.Encode()
}

// SearchHit is an instance a search found, and by which id.
type SearchHit struct {
	Item
	// MatchedBy: instance_id, trigger_event_id, correlation_id,
	// aggregate_id, command_id, or instance_id_suffix (the query is the end
	// of exactly one instance id).
	MatchedBy string `json:"matched_by"`
}

// MinIDSuffix is the shortest end of an instance id Search looks up: the
// list shows the last 12 hex characters, which differ between instances
// created in the same millisecond (a UUIDv7 begins with its creation time).
const MinIDSuffix = 8

// idSuffix returns q as the end of an instance id (lower-case hex without
// dashes) when it can be one: at least MinIDSuffix hex characters, dashes
// where a UUID has them allowed.
func idSuffix(q string) (string, bool) {
	hex := strings.ToLower(strings.ReplaceAll(q, "-", ""))
	if len(hex) < MinIDSuffix || len(hex) >= 32 {
		return "", false
	}
	for _, c := range hex {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return "", false
		}
	}
	return hex, true
}

// MaxSearchHits bounds a search's answer.
const MaxSearchHits = 100

// Search finds instances by any id an operator may hold: the instance's
// own, its trigger event's, its correlation id, its trigger's aggregate id,
// or the id of a command one of its steps sent; every such lookup is by
// index. A query of 8 to 31 hex characters is also looked up as the end of
// an instance id (a scan of the instances, stopped at a second match): one
// match is a hit, several (and nothing else found) an ErrInvalid that says
// to give more of the id.
func (a *Admin) Search(ctx context.Context, q string) ([]SearchHit, error) {
	q = strings.TrimSpace(q)
	if q == "" {
		return nil, saga.Errorf(saga.ErrInvalid, "q is empty: give an instance id (or its last 8 or more characters), a trigger event, correlation, aggregate or command id")
	}
	if len(q) > 200 {
		return nil, saga.Errorf(saga.ErrInvalid, "q is %d characters long; an id is at most 200", len(q))
	}
	var asUUID uuid.NullUUID
	if id, err := uuid.Parse(q); err == nil {
		asUUID = uuid.NullUUID{UUID: id, Valid: true}
		q = id.String() // the canonical form, as the journal stores it
	}
	names, versions, known := a.registered()
	rows, err := a.cfg.Pool.Query(ctx, sqlSearch, a.thresholds(), names, versions, known, asUUID, q, a.scope, MaxSearchHits)
	if err != nil {
		return nil, fmt.Errorf("admin: search: %w", err)
	}
	hits, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (SearchHit, error) {
		var h SearchHit
		var err error
		h.Item, err = a.scanItem(r, &h.MatchedBy)
		return h, err
	})
	if err != nil {
		return nil, fmt.Errorf("admin: search: %w", err)
	}
	if suffix, ok := idSuffix(q); ok && !asUUID.Valid {
		rows, err := a.cfg.Pool.Query(ctx, sqlSearchSuffix, a.thresholds(), names, versions, known, suffix, 2, a.scope)
		if err != nil {
			return nil, fmt.Errorf("admin: search: %w", err)
		}
		ends, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (SearchHit, error) {
			var h SearchHit
			var err error
			h.Item, err = a.scanItem(r, &h.MatchedBy)
			return h, err
		})
		if err != nil {
			return nil, fmt.Errorf("admin: search: %w", err)
		}
		switch {
		case len(ends) > 1 && len(hits) == 0:
			return nil, saga.Errorf(saga.ErrInvalid, "%q is the end of more than one instance id: give more of it (the whole id always works)", q)
		case len(ends) == 1 && !slices.ContainsFunc(hits, func(h SearchHit) bool { return h.ID == ends[0].ID }):
			hits = append(ends, hits...)
		}
	}
	items := make([]Item, len(hits))
	for i := range hits {
		items[i] = hits[i].Item
	}
	if err := a.summarize(ctx, nil, items); err != nil {
		return nil, err
	}
	for i := range hits {
		hits[i].Item = items[i]
	}
	if hits == nil {
		hits = []SearchHit{}
	}
	return hits, nil
}
