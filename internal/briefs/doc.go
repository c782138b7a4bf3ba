// Package briefs is the example application of the demo and the first real
// saga: research brief enrichment, `brief_enrichment` version 1.
//
// An application inserts a DRAFT research brief and, in the same transaction,
// a `research_brief.created` outbox row {"brief_id": "<uuid>"} (Create). The
// relay starts one saga instance per such event, and the runner takes the
// brief through four steps, one transaction each:
//
//  1. claim_brief: DRAFT → ENRICHING; any other status fails permanently.
//     Compensation: back to DRAFT.
//  2. attach_sources: up to 5 documents of the example corpus, the most
//     relevant by PostgreSQL full-text search on the brief's title and body,
//     into brief_sources with their rank (1 is the best). Compensation: delete
//     them; it fails with a retryable error while the title contains
//     [fail-unattach], read when the compensation runs so that an operator
//     can edit the title and retry.
//  3. score_brief: the enrichment jsonb (source_count, total_words,
//     reading_minutes, top_keywords). A title containing [fail-score] fails
//     here permanently. Compensation: clear the enrichment.
//  4. publish_brief: status ENRICHED and a `research_brief.enriched` outbox
//     row {"brief_id", "sources"} emitted in the step's transaction.
//     Compensation: back to DRAFT and a `research_brief.enrichment_reverted`
//     row.
//
// Every step locks the brief's row first and checks the status it expects,
// so a step retried after a failed attempt (which left nothing: the runner
// rolls the whole transaction back) or run twice finds the brief as it needs
// it or fails with a reason. Compensations retry at most 5 times, 200 ms
// apart growing to 2 s, so a stuck example shows up as FAILED within seconds.
// No step calls the network or an AI service: a brief costs a handful of SQL
// statements.
//
// The corpus ships as migrations/examples/0002_documents.sql, written by
// ./corpusgen.
package briefs

//go:generate go run ./corpusgen -o ../../migrations/examples/0002_documents.sql
