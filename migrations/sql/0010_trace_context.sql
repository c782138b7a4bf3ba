-- 0010: trace context of a saga instance.

-- traceparent is the W3C trace context of the span that started the instance
-- (a child of the trigger event's producer span when its row carried one):
-- each step and compensation continues that trace, on whichever relay runs
-- it. NULL when the trigger carried no trace context and tracing was off.
-- Nullable and without a default: adding it rewrites no row.
ALTER TABLE saga_instances ADD COLUMN IF NOT EXISTS traceparent text;
