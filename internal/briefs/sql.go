package briefs

// The package's SQL, in one place. Every statement is parameterised.

const (
	insertBriefSQL = `INSERT INTO research_briefs (tenant_id, title, body) VALUES ($1, $2, $3) RETURNING id`

	// lockBriefSQL serialises a step with anything else that changes the
	// brief (an operator editing its title, another saga) for the length of
	// the step's transaction.
	lockBriefSQL = `SELECT title, status::text FROM research_briefs WHERE id = $1 FOR UPDATE`

	setStatusSQL = `UPDATE research_briefs SET status = $2::research_brief_status, updated_at = now() WHERE id = $1`

	// revertStatusSQL moves a brief back to DRAFT from wherever this saga
	// left it; it matches nothing when the brief is already DRAFT or gone.
	revertStatusSQL = `UPDATE research_briefs SET status = 'DRAFT', updated_at = now()
		WHERE id = $1 AND status <> 'DRAFT' RETURNING status::text`

	// unpublishSQL is publish_brief's compensation: only an ENRICHED brief
	// goes back, so that a brief nobody published emits no reverted event.
	unpublishSQL = `UPDATE research_briefs SET status = 'DRAFT', updated_at = now()
		WHERE id = $1 AND status = 'ENRICHED' RETURNING id`

	deleteSourcesSQL = `DELETE FROM brief_sources WHERE brief_id = $1`

	// attachSourcesSQL ranks the corpus against the brief's title and body.
	// plainto_tsquery ANDs every word, which a long brief rarely matches in
	// full; when it matches nothing, the same lexemes ORed together do, so
	// that a brief gets sources whenever any of its words is in the corpus.
	// The rewrite works on plainto_tsquery's own output (quoted lexemes
	// joined by " & "), so it never re-parses the user's text.
	attachSourcesSQL = `
WITH q AS (
	SELECT plainto_tsquery('english', b.title || ' ' || b.body) AS q_all
	FROM research_briefs b WHERE b.id = $1
), qs AS (
	SELECT q_all, replace(q_all::text, ' & ', ' | ')::tsquery AS q_any FROM q
), hits_all AS (
	SELECT d.id, ts_rank(d.search, qs.q_all) AS score
	FROM documents d, qs WHERE d.search @@ qs.q_all
	ORDER BY score DESC, d.id LIMIT $2
), hits_any AS (
	SELECT d.id, ts_rank(d.search, qs.q_any) AS score
	FROM documents d, qs WHERE d.search @@ qs.q_any AND NOT EXISTS (SELECT 1 FROM hits_all)
	ORDER BY score DESC, d.id LIMIT $2
), picked AS (
	SELECT id, score FROM hits_all UNION ALL SELECT id, score FROM hits_any
)
INSERT INTO brief_sources (brief_id, document_id, rank)
SELECT $1, id, row_number() OVER (ORDER BY score DESC, id) FROM picked
RETURNING document_id, rank`

	// scoreSQL measures the brief and its sources: the number of sources,
	// the words a reader goes through (the brief's title and body and every
	// source's), and the most frequent words that are not English stop words
	// (nor shorter than four letters), most frequent first.
	scoreSQL = `
WITH texts AS (
	SELECT b.title || ' ' || b.body AS t FROM research_briefs b WHERE b.id = $1
	UNION ALL
	SELECT d.title || ' ' || d.body
	FROM brief_sources s JOIN documents d ON d.id = s.document_id WHERE s.brief_id = $1
), words AS (
	SELECT lower(w) AS w FROM texts, regexp_split_to_table(t, '[^[:alpha:]]+') AS w
	WHERE length(w) > 3
), keywords AS (
	SELECT w, count(*) AS n FROM words
	WHERE length(to_tsvector('english', w)) > 0
	GROUP BY w ORDER BY n DESC, w LIMIT $2
)
SELECT
	(SELECT count(*) FROM brief_sources WHERE brief_id = $1),
	(SELECT count(*) FROM texts, regexp_split_to_table(btrim(t), '\s+') AS w WHERE w <> ''),
	coalesce((SELECT array_agg(w ORDER BY n DESC, w) FROM keywords), '{}')`

	setEnrichmentSQL = `UPDATE research_briefs SET enrichment = $2, updated_at = now() WHERE id = $1`

	clearEnrichmentSQL = `UPDATE research_briefs SET enrichment = NULL, updated_at = now()
		WHERE id = $1 AND enrichment IS NOT NULL`

	listSourcesSQL = `SELECT document_id FROM brief_sources WHERE brief_id = $1 ORDER BY rank`
)
