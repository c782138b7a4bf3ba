-- A saga's updates of its instance row stay HOT updates (no new entry in
-- each of the table's indexes) when the row's page has room for the new
-- version. Instances started together are neighbours on a page (their ids
-- grow with time), so a claim leases them in one statement and the rounds
-- that run their steps update them together, before the versions they
-- replaced can be pruned. At 70 % most of a claim's updates found no room;
-- pages filled to 50 % take a claimed page's new versions. Only pages
-- written from now on are filled to 50 %: existing pages keep their rows.
ALTER TABLE saga_instances SET (fillfactor = 50);
