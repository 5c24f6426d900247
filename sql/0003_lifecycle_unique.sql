-- taskq schema, version 3: a placeholder on the lifecycle-retention branch only.
--
-- Migration 3 belongs to the unique-enqueue and requeue work (issue 14, branch lifecycle-unique).
-- Migration numbers must run 1..n without gaps, so this branch ships an empty stand-in to be able to
-- number its own migration 4. When the branches are merged, the lifecycle-unique file replaces this one
-- (delete this file if that branch named its migration 3 differently). Migration 4 does not depend on 3.
SELECT 1;
