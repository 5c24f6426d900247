"""Run by the bad-input matrix: one bad Django task enqueue inside transaction.atomic(), reported as one
JSON line {"observed": error class, "message": ..., "transaction_usable": bool}."""

from __future__ import annotations

import json
import sys

import django

django.setup()

from django.db import connection, transaction  # noqa: E402
from shop.tasks import add  # noqa: E402


def main(case: str) -> dict[str, object]:
    args: tuple[object, ...] = (object(), 1) if case == "not-json" else (1, 2)
    observed, message = "accepted", ""
    with transaction.atomic():
        try:
            add.enqueue(*args)
        except Exception as exc:
            observed, message = type(exc).__name__, str(exc)
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            usable = cursor.fetchone() == (1,)
        transaction.set_rollback(True)  # whatever happened, leave the database as it was
    return {"observed": observed, "message": message, "transaction_usable": usable}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
