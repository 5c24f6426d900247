"""Where the database is (an explicit DSN, `TASKQ_DSN`, or the embedded server), and keeping DSN passwords
out of everything printed or logged."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from urllib.parse import unquote, unquote_plus, urlsplit, urlunsplit

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
    """The DSN without any secret, safe to print or log: the URL's password, and every parameter whose
    name contains `password` (`password`, `sslpassword`, ...), however its name is percent-encoded."""
    if "://" in dsn:
        try:
            parts = urlsplit(dsn)
        except ValueError:
            return "<unparseable DSN>"
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, host = netloc.rsplit("@", 1)
            netloc = f"{userinfo.split(':', 1)[0]}@{host}"
        query = "&".join(p for p in parts.query.split("&") if not _secret_name(unquote_plus(p.split("=", 1)[0])))
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparseable DSN>"
    return make_conninfo(**{k: str(v) for k, v in params.items() if not _secret_name(k)})


def _secret_name(name: str) -> bool:
    return "password" in name.strip().lower()


_URL_USERINFO = re.compile(
    r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/?#@\s]*):(?P<secret>[^/?#\s]*)@", re.I
)
_KEYWORD_PASSWORD = re.compile(r"""(?P<key>password\s*=\s*)(?P<secret>'(?:[^'\\]|\\.)*'|[^\s&]+)""", re.I)
# in a DSN psycopg cannot parse, the words after password= up to the next keyword may all be the password
_LOOSE_PASSWORD = re.compile(r"password\s*=\s*(?P<secret>.*?)(?=\s+\w+\s*=|$)", re.I | re.S)


def _passwords(dsn: str | None) -> set[str]:
    """Every form of the password a DSN carries (raw, percent-decoded, parsed), to scrub from output."""
    if not dsn:
        return set()
    found: set[str] = set()
    try:
        parsed = conninfo_to_dict(dsn).get("password")
        if parsed:
            found.add(str(parsed))
    except psycopg.Error:
        pass
    if "://" in dsn:
        try:
            netloc = urlsplit(dsn).netloc
        except ValueError:
            netloc = ""
        userinfo = netloc.rsplit("@", 1)[0] if "@" in netloc else ""
        if ":" in userinfo:
            raw = userinfo.split(":", 1)[1]
            found.update({raw, unquote(raw)})
    for match in _KEYWORD_PASSWORD.finditer(dsn):
        secret = match.group("secret")
        found.update({secret, secret.strip("'"), unquote(secret)})
    for match in _LOOSE_PASSWORD.finditer(dsn):
        found.update(match.group("secret").split())
    return {s for s in found if s}


def scrub(text: str, dsns: Sequence[str | None]) -> str:
    """`text` with every DSN password masked: those of the given DSNs, and any that looks like one."""
    for dsn in dsns:
        if dsn and dsn in text:
            text = text.replace(dsn, redact_dsn(dsn))
    for secret in sorted(set().union(*(_passwords(d) for d in dsns)), key=len, reverse=True):
        text = text.replace(secret, "***")
    text = _URL_USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}@", text)
    return _KEYWORD_PASSWORD.sub(lambda m: f"{m['key']}***", text)
