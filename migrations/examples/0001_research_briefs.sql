-- Example application schema for the research brief enrichment saga and the
-- demo. Applied by `relay migrate --with-examples`. Not part of the relay.

DO $$ BEGIN
    CREATE TYPE research_brief_status AS ENUM ('DRAFT','ENRICHING','ENRICHED');
EXCEPTION WHEN duplicate_object THEN NULL; END $$;

CREATE TABLE IF NOT EXISTS research_briefs (
    id         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id  uuid NOT NULL,
    title      text NOT NULL,
    body       text NOT NULL DEFAULT '',
    status     research_brief_status NOT NULL DEFAULT 'DRAFT',
    enrichment jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS documents (
    id         uuid PRIMARY KEY,
    title      text NOT NULL,
    body       text NOT NULL,
    search     tsvector GENERATED ALWAYS AS (to_tsvector('english', title || ' ' || body)) STORED
);
CREATE INDEX IF NOT EXISTS documents_search_idx ON documents USING gin (search);

CREATE TABLE IF NOT EXISTS brief_sources (
    brief_id    uuid NOT NULL REFERENCES research_briefs (id) ON DELETE CASCADE,
    document_id uuid NOT NULL REFERENCES documents (id),
    rank        integer NOT NULL,
    PRIMARY KEY (brief_id, document_id)
);
