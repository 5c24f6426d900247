"""Where the database is: an explicit DSN, `TASKQ_DSN`, or the embedded server."""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from taskq.exceptions import ConfigurationError


def resolve_dsn(dsn: str | None = None) -> str:
    """The DSN to use: `dsn`, else `TASKQ_DSN`, else the embedded server (started if needed)."""
    chosen = dsn or os.environ.get("TASKQ_DSN") or None
    if chosen is None:
        from taskq.embedded import embedded_dsn

        return embedded_dsn()
    try:
        conninfo_to_dict(chosen)
    except psycopg.ProgrammingError:
        # psycopg's message quotes the text around the fault, which may be a piece of the password
        # (`password=two words` -> missing "=" after "words"): say nothing of the DSN's content
        raise ConfigurationError(
            "invalid DSN: expected a URL (postgresql://user@host:port/dbname) or key=value pairs "
            "(host=... dbname=...), with values containing spaces in single quotes; "
            "the DSN is not shown because it may contain a password"
        ) from None
    return chosen


def redact_dsn(dsn: str) -> str:
    """The DSN without any password, safe to print or log."""
    if "://" in dsn:
        try:
            parts = urlsplit(dsn)
        except ValueError:
            return "<unparseable DSN>"
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, host = netloc.rsplit("@", 1)
            netloc = f"{userinfo.split(':', 1)[0]}@{host}"
        query = "&".join(p for p in parts.query.split("&") if not p.lower().startswith("password="))
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparseable DSN>"
    params.pop("password", None)
    return make_conninfo(**{k: str(v) for k, v in params.items()})
