-- 0021: claims shared between tenants. Forward-only: never edit after
-- release.
--
-- The runner's claim serves the tenants with due work in turn instead of
-- oldest first for everyone, so that one tenant's backlog never makes the
-- others wait behind all of it. It finds them with a skip scan of this
-- index (one descent per tenant, whatever its backlog) and takes each one's
-- oldest due instances from it. It holds only unfinished instances, like
-- saga_claim_idx, and its columns change when saga_claim_idx's do (status,
-- next_attempt_at): a step's write that is a HOT update stays one.
CREATE INDEX IF NOT EXISTS saga_tenant_due_idx
    ON saga_instances (tenant_id, next_attempt_at, id) WHERE status IN ('RUNNING', 'COMPENSATING');
