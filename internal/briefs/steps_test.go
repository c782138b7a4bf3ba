package briefs

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/test/pgtest"
	"github.com/compensa/compensa/test/testkit"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// The steps' SQL, run inside a test transaction that is rolled back: what the
// runner does around them (one transaction per step, the journal) is tested
// end to end in briefs_test.

type stepBundle struct {
	ctx    context.Context
	tx     pgx.Tx
	tenant uuid.UUID
}

func setupTx(t *testing.T) *stepBundle {
	t.Helper()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(ctx) })
	return &stepBundle{ctx: ctx, tx: tx, tenant: uuid.New()}
}

func (b *stepBundle) brief(t *testing.T, title, body string) uuid.UUID {
	t.Helper()
	id, err := Create(b.ctx, b.tx, b.tenant, title, body)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func (b *stepBundle) status(t *testing.T, id uuid.UUID) string {
	t.Helper()
	var s string
	if err := b.tx.QueryRow(b.ctx, `SELECT status::text FROM research_briefs WHERE id = $1`, id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

func (b *stepBundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := b.tx.QueryRow(b.ctx, sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func (b *stepBundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := b.tx.Exec(b.ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// enriching returns a claimed brief.
func (b *stepBundle) enriching(t *testing.T, title, body string) uuid.UUID {
	t.Helper()
	id := b.brief(t, title, body)
	if err := claimBrief(b.ctx, b.tx, id); err != nil {
		t.Fatal(err)
	}
	return id
}

func TestCreateWritesBriefAndTriggerInTheCallersTransaction(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	tenant := uuid.New()

	commit := func(title string, ok bool) uuid.UUID {
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		id, err := Create(ctx, tx, tenant, title, "body")
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return id
	}
	id := commit("kept", true)
	gone := commit("rolled back", false)

	var status, evType, aggType, aggID string
	var payload json.RawMessage
	var gotTenant uuid.UUID
	err := db.Pool.QueryRow(ctx, `SELECT b.status::text, o.event_type, o.aggregate_type, o.aggregate_id, o.payload, o.tenant_id
		FROM research_briefs b JOIN outbox o ON o.aggregate_id = b.id::text WHERE b.id = $1`, id).
		Scan(&status, &evType, &aggType, &aggID, &payload, &gotTenant)
	if err != nil {
		t.Fatal(err)
	}
	if status != StatusDraft || evType != EventCreated || aggType != AggregateType || aggID != id.String() || gotTenant != tenant {
		t.Fatalf("got status %s event %s aggregate %s/%s tenant %s", status, evType, aggType, aggID, gotTenant)
	}
	var p map[string]string
	if err := json.Unmarshal(payload, &p); err != nil || len(p) != 1 || p["brief_id"] != id.String() {
		t.Fatalf("payload %s, want {\"brief_id\": %q}", payload, id)
	}
	var n int
	db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM research_briefs WHERE id = $1) + (SELECT count(*) FROM outbox WHERE aggregate_id = $1::text)`, gone).Scan(&n)
	if n != 0 {
		t.Fatalf("rolled-back Create left %d rows", n)
	}

	tx, _ := db.Pool.Begin(ctx)
	defer tx.Rollback(ctx)
	if _, err := Create(ctx, tx, tenant, "", "body"); !errors.Is(err, saga.ErrInvalid) {
		t.Fatalf("empty title: got %v, want ErrInvalid", err)
	}
}

func TestClaimBrief(t *testing.T) {
	t.Parallel()
	b := setupTx(t)
	id := b.brief(t, "Rooftop solar", "inverters")
	if err := claimBrief(b.ctx, b.tx, id); err != nil {
		t.Fatal(err)
	}
	if s := b.status(t, id); s != StatusEnriching {
		t.Fatalf("status %s after claim", s)
	}
	// A second claim (a second trigger for the same brief) must not take a
	// brief another saga holds: permanent, so its saga compensates nothing.
	err := claimBrief(b.ctx, b.tx, id)
	if !errors.Is(err, ErrNotDraft) || !saga.IsPermanent(err) {
		t.Fatalf("claim of an ENRICHING brief: got %v, want permanent ErrNotDraft", err)
	}
	if !strings.Contains(err.Error(), "ENRICHING") {
		t.Fatalf("message should say the status: %v", err)
	}
	err = claimBrief(b.ctx, b.tx, uuid.New())
	if !errors.Is(err, ErrBriefMissing) || saga.IsPermanent(err) {
		t.Fatalf("claim of a missing brief: got %v, want a retryable ErrBriefMissing (ClaimRetry bounds it)", err)
	}

	if err := unclaimBrief(b.ctx, b.tx, id); err != nil {
		t.Fatal(err)
	}
	if s := b.status(t, id); s != StatusDraft {
		t.Fatalf("status %s after unclaim", s)
	}
	// Nothing to undo is not an error: a compensation may run twice.
	if err := unclaimBrief(b.ctx, b.tx, id); err != nil {
		t.Fatal(err)
	}
	if err := unclaimBrief(b.ctx, b.tx, uuid.New()); err != nil {
		t.Fatal(err)
	}
}

func TestAttachSourcesRanksRelevantDocuments(t *testing.T) {
	t.Parallel()
	b := setupTx(t)
	id := b.enriching(t, "Rooftop solar for a school", "Which inverters and photovoltaic panels suit a school roof?")
	srcs, err := attachSources(b.ctx, b.tx, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(srcs) != MaxSources {
		t.Fatalf("got %d sources, want %d", len(srcs), MaxSources)
	}
	for i, s := range srcs {
		if s.Rank != i+1 {
			t.Fatalf("sources not ranked 1..n best first: %+v", srcs)
		}
		var title string
		b.tx.QueryRow(b.ctx, `SELECT title FROM documents WHERE id = $1`, s.DocumentID).Scan(&title)
		if !strings.Contains(title, "solar") {
			t.Fatalf("source %d is %q, not about solar power", i+1, title)
		}
	}
	// Ranks in the table match, and rank 1 has the highest ts_rank (this
	// brief's words do not all occur in one document: ranked by the OR of
	// its words).
	if n := b.count(t, `SELECT count(*) FROM brief_sources WHERE brief_id = $1 AND rank BETWEEN 1 AND 5`, id); n != MaxSources {
		t.Fatalf("brief_sources has %d rows", n)
	}
	if n := b.count(t, `
		WITH q AS (SELECT replace(plainto_tsquery('english', title || ' ' || body)::text, ' & ', ' | ')::tsquery q FROM research_briefs WHERE id = $1),
		r AS (SELECT s.rank, ts_rank(d.search, q.q) AS score FROM brief_sources s JOIN documents d ON d.id = s.document_id, q WHERE s.brief_id = $1)
		SELECT count(*) FROM r a JOIN r b ON a.rank < b.rank WHERE a.score < b.score`, id); n != 0 {
		t.Fatalf("%d pairs of sources ranked against their score", n)
	}

	// Running the step again replaces its rows instead of adding more.
	again, err := attachSources(b.ctx, b.tx, id)
	if err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM brief_sources WHERE brief_id = $1`, id); n != MaxSources || len(again) != MaxSources {
		t.Fatalf("second run: %d rows, %d returned", n, len(again))
	}
}

func TestAttachSourcesFallsBackToAnyWord(t *testing.T) {
	t.Parallel()
	b := setupTx(t)
	// No single document holds all of these words.
	title, body := "Sourdough coral qubits", "ransomware and heat pumps for migrating songbirds"
	id := b.enriching(t, title, body)
	if n := b.count(t, `SELECT count(*) FROM documents WHERE search @@ plainto_tsquery('english', $1)`, title+" "+body); n != 0 {
		t.Fatalf("test premise: %d documents match every word", n)
	}
	srcs, err := attachSources(b.ctx, b.tx, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(srcs) != MaxSources {
		t.Fatalf("got %d sources, want %d through the OR fallback", len(srcs), MaxSources)
	}

	// A brief with no word of the corpus gets no sources, and no error.
	none := b.enriching(t, "Zyxwv qwrtp", "the and of")
	srcs, err = attachSources(b.ctx, b.tx, none)
	if err != nil || len(srcs) != 0 {
		t.Fatalf("got %v, %v; want no sources and no error", srcs, err)
	}
	// Quotes and tsquery operators in the text are only text.
	odd := b.enriching(t, `solar's "panels" & | ! <-> (inverters):*`, `it''s`)
	if _, err := attachSources(b.ctx, b.tx, odd); err != nil {
		t.Fatalf("text with operators: %v", err)
	}
}

func TestAttachSourcesNeedsAnEnrichingBrief(t *testing.T) {
	t.Parallel()
	b := setupTx(t)
	id := b.brief(t, "Rooftop solar", "")
	_, err := attachSources(b.ctx, b.tx, id)
	if !errors.Is(err, ErrNotEnriching) || !saga.IsPermanent(err) {
		t.Fatalf("got %v, want permanent ErrNotEnriching", err)
	}
	_, err = attachSources(b.ctx, b.tx, uuid.New())
	if !errors.Is(err, ErrBriefMissing) || !saga.IsPermanent(err) {
		t.Fatalf("got %v, want permanent ErrBriefMissing", err)
	}
}

func TestDetachSourcesWaitsForTheMarkerToGo(t *testing.T) {
	t.Parallel()
	b := setupTx(t)
	id := b.enriching(t, "Rooftop solar "+FailUnattachMarker, "inverters")
	if _, err := attachSources(b.ctx, b.tx, id); err != nil {
		t.Fatal(err)
	}
	err := detachSources(b.ctx, b.tx, id)
	if !errors.Is(err, ErrFailUnattach) || saga.IsPermanent(err) {
		t.Fatalf("got %v, want a retryable ErrFailUnattach", err)
	}
	if !strings.Contains(err.Error(), "remove it from the title") {
		t.Fatalf("the message should say what to do: %v", err)
	}
	if n := b.count(t, `SELECT count(*) FROM brief_sources WHERE brief_id = $1`, id); n != MaxSources {
		t.Fatalf("failed compensation deleted sources: %d left", n)
	}
	// The title is read at compensation time: an operator's edit lets it through.
	b.exec(t, `UPDATE research_briefs SET title = replace(title, $2, '') WHERE id = $1`, id, FailUnattachMarker)
	if err := detachSources(b.ctx, b.tx, id); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM brief_sources WHERE brief_id = $1`, id); n != 0 {
		t.Fatalf("%d sources left", n)
	}
	if err := detachSources(b.ctx, b.tx, id); err != nil {
		t.Fatalf("nothing to undo: %v", err)
	}
	if err := detachSources(b.ctx, b.tx, uuid.New()); err != nil {
		t.Fatalf("missing brief: %v", err)
	}
}

func TestScoreBrief(t *testing.T) {
	testkit.SkipShort(t, "scores the whole corpus")
	t.Parallel()
	b := setupTx(t)
	id := b.enriching(t, "Healthier farm soil", "How much do cover crops and no-till planting raise soil organic carbon?")
	if _, err := attachSources(b.ctx, b.tx, id); err != nil {
		t.Fatal(err)
	}
	e, err := scoreBrief(b.ctx, b.tx, id)
	if err != nil {
		t.Fatal(err)
	}
	// Count the words again, in Go, from the same texts.
	rows, _ := b.tx.Query(b.ctx, `SELECT title || ' ' || body FROM research_briefs WHERE id = $1
		UNION ALL SELECT d.title || ' ' || d.body FROM brief_sources s JOIN documents d ON d.id = s.document_id WHERE s.brief_id = $1`, id)
	texts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	words := 0
	for _, s := range texts {
		words += len(strings.Fields(s))
	}
	if e.SourceCount != MaxSources || e.TotalWords != words || words == 0 {
		t.Fatalf("enrichment %+v, want %d sources and %d words", e, MaxSources, words)
	}
	if want := int(math.Ceil(float64(words) / WordsPerMinute)); e.ReadingMinutes != want {
		t.Fatalf("reading_minutes %d, want %d", e.ReadingMinutes, want)
	}
	if len(e.TopKeywords) != TopKeywords || e.TopKeywords[0] != "soil" {
		t.Fatalf("top_keywords %v, want %d led by \"soil\"", e.TopKeywords, TopKeywords)
	}
	for _, k := range e.TopKeywords {
		if k == "with" || k == "their" || len(k) < 4 {
			t.Fatalf("stop word or short word in keywords: %v", e.TopKeywords)
		}
	}
	var stored Enrichment
	var raw []byte
	b.tx.QueryRow(b.ctx, `SELECT enrichment FROM research_briefs WHERE id = $1`, id).Scan(&raw)
	if err := json.Unmarshal(raw, &stored); err != nil || stored.TotalWords != e.TotalWords || len(stored.TopKeywords) != TopKeywords {
		t.Fatalf("stored enrichment %s (%v)", raw, err)
	}
	for _, key := range []string{"source_count", "total_words", "reading_minutes", "top_keywords"} {
		if !strings.Contains(string(raw), `"`+key+`"`) {
			t.Fatalf("stored enrichment %s has no %s", raw, key)
		}
	}

	if err := clearScore(b.ctx, b.tx, id); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM research_briefs WHERE id = $1 AND enrichment IS NULL`, id); n != 1 {
		t.Fatal("enrichment not cleared")
	}
	if err := clearScore(b.ctx, b.tx, id); err != nil {
		t.Fatalf("nothing to undo: %v", err)
	}
}

func TestScoreBriefFailsForGoodOnTheMarker(t *testing.T) {
	t.Parallel()
	b := setupTx(t)
	id := b.enriching(t, FailScoreMarker+" Healthier farm soil", "cover crops")
	_, err := scoreBrief(b.ctx, b.tx, id)
	if !errors.Is(err, ErrFailScore) || !saga.IsPermanent(err) {
		t.Fatalf("got %v, want permanent ErrFailScore", err)
	}
	if n := b.count(t, `SELECT count(*) FROM research_briefs WHERE id = $1 AND enrichment IS NULL`, id); n != 1 {
		t.Fatal("a failed score stored an enrichment")
	}
}

func TestPublishBrief(t *testing.T) {
	t.Parallel()
	b := setupTx(t)
	id := b.enriching(t, "Cleaner ocean shipping", "slow steaming and wind-assisted propulsion")
	srcs, err := attachSources(b.ctx, b.tx, id)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := publishBrief(b.ctx, b.tx, id)
	if err != nil {
		t.Fatal(err)
	}
	if s := b.status(t, id); s != StatusEnriched {
		t.Fatalf("status %s after publish", s)
	}
	p, ok := msg.Payload.(EnrichedPayload)
	if msg.EventType != EventEnriched || msg.AggregateID != id.String() || !ok || p.BriefID != id || len(p.Sources) != len(srcs) {
		t.Fatalf("message %+v", msg)
	}
	for i, s := range srcs {
		if p.Sources[i] != s.DocumentID {
			t.Fatalf("payload sources %v not in rank order of %+v", p.Sources, srcs)
		}
	}
	// Publishing twice is refused: the brief is no longer this saga's to publish.
	if _, err := publishBrief(b.ctx, b.tx, id); !errors.Is(err, ErrNotEnriching) || !saga.IsPermanent(err) {
		t.Fatalf("second publish: %v", err)
	}

	rev, ok, err := unpublishBrief(b.ctx, b.tx, id)
	if err != nil || !ok || rev.EventType != EventEnrichmentReverted || rev.AggregateID != id.String() {
		t.Fatalf("unpublish: %+v %v %v", rev, ok, err)
	}
	if s := b.status(t, id); s != StatusDraft {
		t.Fatalf("status %s after unpublish", s)
	}
	// Nothing published, nothing announced.
	if _, ok, err := unpublishBrief(b.ctx, b.tx, id); ok || err != nil {
		t.Fatalf("second unpublish: ok=%v err=%v", ok, err)
	}
}

func TestAttachSourcesPrefersDocumentsWithEveryWord(t *testing.T) {
	t.Parallel()
	b := setupTx(t)
	id := b.enriching(t, "Reef fish", "coral nurseries")
	if n := b.count(t, `SELECT count(*) FROM documents WHERE search @@ plainto_tsquery('english', 'Reef fish coral nurseries')`); n == 0 {
		t.Fatal("test premise: some document should hold every word")
	}
	srcs, err := attachSources(b.ctx, b.tx, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(srcs) == 0 {
		t.Fatal("no sources")
	}
	for _, s := range srcs {
		if n := b.count(t, `SELECT count(*) FROM documents WHERE id = $1 AND search @@ plainto_tsquery('english', 'Reef fish coral nurseries')`, s.DocumentID); n != 1 {
			t.Fatalf("source %+v lacks a word of the brief although documents with all of them exist", s)
		}
	}
}
