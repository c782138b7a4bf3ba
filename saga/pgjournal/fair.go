package pgjournal

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

const (
	// maxTenantWeight bounds Config.TenantWeights.
	maxTenantWeight = 1000
	// fairRecheck is how long the journal claims oldest-first after it
	// found at most one tenant with due work: the cost of a lone tenant is
	// one look per interval, and a second tenant waits at most this long
	// for its share.
	fairRecheck = 250 * time.Millisecond
	// fairScan bounds the tenants with unfinished instances one look
	// passes, in multiples of the batch (most of them have due work when
	// the runner is behind).
	fairScan = 4
)

// fairState is where the claims shared between tenants stand.
type fairState struct {
	mu sync.Mutex
	// next is the smallest tenant id the next look starts from: after the
	// last tenant served, so that the tenants are served in turn.
	next uuid.UUID
	// soloUntil: until then, claims are oldest-first (at most one tenant
	// had due work at the last look).
	soloUntil time.Time
}

// shares is one claim's split: tenants[k] gets up to quotas[k] instances.
type shares struct {
	tenants []uuid.UUID
	quotas  []int32
}

// tenantShares looks for the tenants with due work and splits batch
// between them; nil means a claim oldest-first (one tenant or none, or
// Config.OldestFirst).
func (j *Journal) tenantShares(ctx context.Context, batch int) (*shares, error) {
	if j.oldestFirst {
		return nil, nil
	}
	f := &j.fair
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	if now.Before(f.soloUntil) {
		return nil, nil
	}
	tenants, wrapped, err := j.dueTenants(ctx, f.next, batch)
	if err != nil {
		return nil, err
	}
	// The next look starts after the last tenant served, or from the
	// first when this one reached the last.
	next := uuid.Nil
	if !wrapped {
		next = after(tenants[len(tenants)-1])
	}
	if wrapped && len(tenants) < batch && f.next != uuid.Nil {
		// The look started in the middle and reached the last tenant: the
		// tenants before where it started take the rest of the batch.
		more, moreWrapped, err := j.dueTenants(ctx, uuid.Nil, batch-len(tenants))
		if err != nil {
			return nil, err
		}
		tenants = append(tenants, more...)
		if len(more) > 0 && !moreWrapped {
			next = after(more[len(more)-1])
		}
	}
	tenants = dedupe(tenants)
	if len(tenants) < 2 {
		f.next, f.soloUntil = uuid.Nil, now.Add(fairRecheck)
		return nil, nil
	}
	f.next = next
	return j.split(tenants, batch), nil
}

// dueTenants reads up to most tenants with due work from tenant id from
// on; wrapped reports that the look reached the last tenant.
func (j *Journal) dueTenants(ctx context.Context, from uuid.UUID, most int) (tenants []uuid.UUID, wrapped bool, err error) {
	if most <= 0 {
		return nil, false, nil
	}
	scan := fairScan * most
	rows, err := j.pool.Query(ctx, sqlDueTenants, j.clock(), from, scan, most)
	if err != nil {
		return nil, false, fmt.Errorf("pgjournal: claim: tenants with due work: %w", err)
	}
	var t uuid.UUID
	var passed int
	_, err = pgx.ForEachRow(rows, []any{&t, &passed}, func() error {
		tenants = append(tenants, t)
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("pgjournal: claim: tenants with due work: %w", err)
	}
	// The scan ended before its bound: it passed the last tenant. (No row
	// at all: nothing due from here on, which is a wrap too.)
	return tenants, len(tenants) == 0 || passed < scan && len(tenants) < most, nil
}

// split gives each tenant its share of batch by weight, at least one.
func (j *Journal) split(tenants []uuid.UUID, batch int) *shares {
	total := 0
	for _, t := range tenants {
		total += j.weight(t)
	}
	s := &shares{tenants: tenants, quotas: make([]int32, len(tenants))}
	for k, t := range tenants {
		s.quotas[k] = int32(max(1, (batch*j.weight(t)+total-1)/total))
	}
	return s
}

func (j *Journal) weight(t uuid.UUID) int {
	if w, ok := j.weights[t]; ok {
		return w
	}
	return 1
}

// after is the uuid right after u in PostgreSQL's order (bytewise), or Nil
// after the last one.
func after(u uuid.UUID) uuid.UUID {
	for i := len(u) - 1; i >= 0; i-- {
		u[i]++
		if u[i] != 0 {
			return u
		}
	}
	return uuid.Nil
}

func dedupe(ts []uuid.UUID) []uuid.UUID {
	seen := make(map[uuid.UUID]bool, len(ts))
	out := ts[:0]
	for _, t := range ts {
		if !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	return out
}
