-- Declared (YAML) saga definitions as first loaded: an instance runs the
-- version that started it from this body, even after its file was changed or
-- removed, and a changed body under a stored version is refused (the hash is
-- of the definition's canonical form, so comments and layout do not count).
CREATE TABLE IF NOT EXISTS saga_definitions (
    saga_name    text NOT NULL,
    saga_version integer NOT NULL,
    hash         text NOT NULL,
    body         text NOT NULL,
    source_file  text NOT NULL DEFAULT '',
    loaded_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (saga_name, saga_version)
);
