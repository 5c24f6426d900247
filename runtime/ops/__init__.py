"""taskq.ops: the operator actions, one service function each, called alike by `JobsClient`, the
generated `SyncJobsClient`, the CLI and the web API, so that a cancel from any of them is the same
statement with the same checks: `jobs` (cancel, requeue), `queues` (stats, pause, resume, limits),
`schedules` (list, pause, resume, trigger), `retention` (prune), `tokens` (the web API's tokens)."""
