-- taskq schema, version 3: a placeholder on the schedules branch only.
--
-- Migration 3 belongs to the unique-enqueue and requeue work (branch lifecycle-unique), migration 4 to
-- retention (branch lifecycle-retention). Migration numbers run 1..n without gaps, so this branch ships
-- empty stand-ins to number its own migration 5. When the branches are merged, their files replace these.
-- Migration 5 does not depend on 3 or 4.
SELECT 1;
