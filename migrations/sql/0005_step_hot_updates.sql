-- A saga step's update of its instance row is a HOT update.
--
-- A step that completes changes none of saga_instances' indexed columns
-- (the runner keeps next_attempt_at of an instance that is already due, and
-- status stays RUNNING), so PostgreSQL can write the new row version on the
-- same page without a new entry in each of the table's seven indexes, if the
-- page has room. Leaving 30 % of each page free gives it that room; the space
-- is reused as dead row versions are pruned. Only pages written from now on
-- are filled to 70 %: existing pages keep their rows until they change.
ALTER TABLE saga_instances SET (fillfactor = 70);
