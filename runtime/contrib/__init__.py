"""Optional integrations, each behind a pip extra: `taskq.contrib.django` (taskq[django]),
`taskq.contrib.sqlalchemy` (taskq[sqlalchemy]) and `taskq.contrib.otel` (taskq[otel]). They import the
core; the core never imports them. OpenTelemetry is found by name: taskq.tracing loads taskq.contrib.otel
when the application has imported OpenTelemetry, and it registers itself into taskq.tracing's hooks."""
