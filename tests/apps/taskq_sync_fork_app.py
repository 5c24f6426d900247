"""Run by test_sync_client.py in a process of its own: a SyncJobsClient used before os.fork(), then by
the child and by the parent after the child has exited. Prints one JSON line of what it saw."""

from __future__ import annotations

import json
import os
import sys

from taskq import SyncJobsClient


def main(dsn: str) -> int:
    client = SyncJobsClient.connect(dsn)
    before = client.enqueue("fork.before", 1)  # the pool opens here, in the parent
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            child = client.enqueue("fork.child", 2)  # a pool of the child's own
            found = client.get(child.job_id)
            code = 0 if found is not None and client.get(before.job_id) is not None else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    after = client.enqueue("fork.after", 3)  # the parent's pool survived the child
    seen = client.get(after.job_id)
    client.close()
    print(json.dumps({"child_exit": os.waitstatus_to_exitcode(status), "parent_ok": seen is not None,
                      "before": str(before.job_id), "after": str(after.job_id)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
