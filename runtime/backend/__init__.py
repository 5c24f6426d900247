"""taskq.backend: the only layer that talks SQL. Every statement taskq runs is a named query of
`taskq.sql`, executed by one module of this package, by noun:

- `core`: `Backend`, the job operations of clients and operators over one connection pool;
- `params`, `_conn`: what the statements take and give back, connect arguments, uuid7;
- `caller`: enqueue in the caller's own transaction (`connection=`);
- `unique`, `dependencies`, `notify`: the enqueue's unique keys, parent edges and NOTIFY;
- `queues`, `retention`, `web`: queue control, pruning, the web API's reads and writes;
- `workers`, `schedules`: the worker's claims, heartbeat, finish and reclaim, and its scheduler;
- `supervisor`: the supervisor's short synchronous calls; `migrations`: the schema;
- `invariants`: the consistency checks of `taskq.invariants`;
- `bench`: what `taskq bench` reads of its own rows and its clean-up (sql/bench.sql);
- `*_sync`: the generated synchronous twins, and `sync_pool`, their pool.

Nothing outside this package executes a query or holds a pool.
"""

from __future__ import annotations

from taskq.backend._conn import (
    CANCEL_CHANNEL,
    JOBS_CHANNEL,
    WORKER_APPLICATION_NAME,
    connect_error,
    connection_kwargs,
    is_connection_lost,
    transaction_pooler_from_env,
    uuid7,
    uuid7_many,
)
from taskq.backend.core import Backend, check_schema
from taskq.backend.params import (
    UNIQUE_INSERT_TRIES,
    InsertedJob,
    JobBatch,
    JobInsert,
    JobOptions,
    RequeueParams,
    RequeueRow,
    filter_params,
    row_to_job,
)
from taskq.models import JobRow

__all__ = [
    "CANCEL_CHANNEL",
    "JOBS_CHANNEL",
    "UNIQUE_INSERT_TRIES",
    "WORKER_APPLICATION_NAME",
    "Backend",
    "InsertedJob",
    "JobBatch",
    "JobInsert",
    "JobOptions",
    "JobRow",
    "RequeueParams",
    "RequeueRow",
    "check_schema",
    "connect_error",
    "connection_kwargs",
    "filter_params",
    "is_connection_lost",
    "row_to_job",
    "transaction_pooler_from_env",
    "uuid7",
    "uuid7_many",
]
