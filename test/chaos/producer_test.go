//go:build chaos

package chaos

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/compensa/compensa/internal/briefs"
	"github.com/compensa/compensa/outbox"
)

// producer is the example application under load: each transaction commits
// research briefs through briefs.Create (a brief and its trigger outbox row)
// and "noise" outbox rows of an event type no saga listens to, paced to the
// configured rates. It records each brief by the outcome of its commit, as
// Jepsen's clients do: ok (COMMIT returned), failed (an error before COMMIT:
// rolled back) or unknown (COMMIT itself failed: it may have committed).
type producer struct {
	pool        *pgxpool.Pool
	triggerRate float64 // briefs per second
	noiseRate   float64 // other outbox rows per second
	// failEvery marks every n-th brief with briefs.FailScoreMarker, so that
	// its saga compensates (0: none).
	failEvery int

	mu      sync.Mutex
	ok      []uuid.UUID
	unknown []uuid.UUID

	briefsOK, noiseOK, txOK, txFailed, txUnknown atomic.Int64
	seq                                          atomic.Int64
	lastErr                                      atomic.Pointer[string]

	began, ended time.Time
	cancel       context.CancelFunc
	done         sync.WaitGroup
}

// noiseEvent is the event type of the producer's other rows: streamed,
// counted by the correlator, started by nothing.
const noiseEvent = "chaos.noise"

var tenants = []uuid.UUID{
	uuid.MustParse("11111111-1111-4111-8111-111111111111"),
	uuid.MustParse("22222222-2222-4222-8222-222222222222"),
	uuid.MustParse("33333333-3333-4333-8333-333333333333"),
}

// startProducer runs workers goroutines until stop, each with its share of
// the rates.
func startProducer(pool *pgxpool.Pool, triggerRate, noiseRate float64, failEvery, workers int) *producer {
	p := &producer{pool: pool, triggerRate: triggerRate, noiseRate: noiseRate, failEvery: failEvery}
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	p.began = time.Now()
	for w := range workers {
		p.done.Add(1)
		go func() {
			defer p.done.Done()
			p.work(ctx, w, triggerRate/float64(workers), noiseRate/float64(workers))
		}()
	}
	return p
}

func (p *producer) stop() {
	p.cancel()
	p.done.Wait()
	p.ended = time.Now()
}

// work paces one worker: every tick it commits what is due since it began,
// in one transaction. Debt after an outage is capped at one second's worth,
// so that a database restart is not followed by a burst.
func (p *producer) work(ctx context.Context, w int, tRate, nRate float64) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	began := time.Now()
	var tSent, nSent float64
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		el := time.Since(began).Seconds()
		tDue, nDue := el*tRate-tSent, el*nRate-nSent
		if tDue > tRate {
			tSent += tDue - tRate
			tDue = tRate
		}
		if nDue > nRate {
			nSent += nDue - nRate
			nDue = nRate
		}
		nt, nn := int(tDue), int(nDue)
		if nt == 0 && nn == 0 {
			continue
		}
		if p.commit(ctx, w, nt, nn) {
			tSent += float64(nt)
			nSent += float64(nn)
		}
	}
}

func (p *producer) commit(ctx context.Context, w, nt, nn int) bool {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var ids []uuid.UUID
	fail := func(err error, unknown bool) bool {
		s := err.Error()
		p.lastErr.Store(&s)
		if unknown {
			p.txUnknown.Add(1)
			p.mu.Lock()
			p.unknown = append(p.unknown, ids...)
			p.mu.Unlock()
		} else {
			p.txFailed.Add(1)
		}
		return false
	}
	tx, err := p.pool.Begin(cctx)
	if err != nil {
		return fail(err, false)
	}
	defer tx.Rollback(context.Background())
	for range nt {
		n := p.seq.Add(1)
		title, body := briefs.Sample(int(n))
		if p.failEvery > 0 && n%int64(p.failEvery) == 0 {
			title += " " + briefs.FailScoreMarker
		}
		id, err := briefs.Create(cctx, tx, tenants[int(n)%len(tenants)], title, body)
		if err != nil {
			return fail(err, false)
		}
		ids = append(ids, id)
	}
	if nn > 0 {
		msgs := make([]outbox.Message, nn)
		for i := range msgs {
			msgs[i] = outbox.Message{TenantID: tenants[i%len(tenants)], AggregateType: "chaos", AggregateID: fmt.Sprint(w),
				EventType: noiseEvent, Payload: map[string]int{"worker": w, "i": i}}
		}
		if err := outbox.Write(cctx, tx, msgs...); err != nil {
			return fail(err, false)
		}
	}
	if err := tx.Commit(cctx); err != nil {
		return fail(err, true)
	}
	p.txOK.Add(1)
	p.briefsOK.Add(int64(nt))
	p.noiseOK.Add(int64(nn))
	p.mu.Lock()
	p.ok = append(p.ok, ids...)
	p.mu.Unlock()
	return true
}

// rate is the committed events (briefs + noise) per second over the run.
func (p *producer) rate() float64 {
	end := p.ended
	if end.IsZero() {
		end = time.Now()
	}
	return float64(p.briefsOK.Load()+p.noiseOK.Load()) / end.Sub(p.began).Seconds()
}

func (p *producer) summary() string {
	s := fmt.Sprintf("%d briefs + %d other rows committed in %d transactions (%.0f events/s); %d transactions failed, %d with an unknown outcome",
		p.briefsOK.Load(), p.noiseOK.Load(), p.txOK.Load(), p.rate(), p.txFailed.Load(), p.txUnknown.Load())
	if e := p.lastErr.Load(); e != nil && (p.txFailed.Load() > 0 || p.txUnknown.Load() > 0) {
		s += fmt.Sprintf(" (last error: %.120s)", *e)
	}
	return s
}

func (p *producer) acked() []uuid.UUID {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]uuid.UUID(nil), p.ok...)
}

var errStopped = errors.New("producer stopped")
