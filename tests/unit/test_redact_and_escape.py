"""What taskq prints of a DSN keeps no secret parameter, however it is spelled; what the CLI prints of
names anyone can write (actors, queues, tags, messages) cannot drive the terminal."""

from __future__ import annotations

import json

import pytest

from taskq.cli.output import printable, table, to_json
from taskq.dsn import redact_dsn

SECRETS = ("s3cret", "keyS3cret", "pct", "upper")


@pytest.mark.parametrize("dsn", [
    "host=db user=u password=s3cret sslpassword=keyS3cret dbname=app",
    "host=db user=u password='two s3cret words'",
    "postgresql://u:s3cret@db/app?sslpassword=keyS3cret&sslmode=require",
    "postgresql://u@db/app?%70assword=pct",
    "postgresql://u@db/app?ssl%70assword=pct&connect_timeout=2",
    "postgresql://u@db/app?SSLPASSWORD=upper",
    "postgres://u@db/app?password=s3cret",
])
def test_redact_dsn_drops_every_password_parameter(dsn: str) -> None:
    redacted = redact_dsn(dsn)
    assert not any(secret in redacted for secret in SECRETS), redacted
    assert "db" in redacted and "u" in redacted


def test_redact_dsn_keeps_the_other_parameters() -> None:
    assert "sslmode=require" in redact_dsn("postgresql://u:pw@db/app?sslpassword=x&sslmode=require")
    assert "connect_timeout=2" in redact_dsn("postgresql://u@db/app?ssl%70assword=x&connect_timeout=2")
    assert "dbname=app" in redact_dsn("host=db sslpassword=x dbname=app")


EVIL = "evil\x1b[2J\x1b]0;pwned\x07\x1b[31mFAKE\x9b8m\x7f"


def test_printable_shows_c0_c1_and_del_as_escapes() -> None:
    shown = printable(EVIL)
    assert not any(ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 for ch in shown)
    assert shown == "evil\\x1b[2J\\x1b]0;pwned\\x07\\x1b[31mFAKE\\x9b8m\\x7f"
    assert printable("a\nb", newlines=True) == "a\nb" and printable("a\nb") == "a\\x0ab"
    assert printable("café ✓") == "café ✓"


def test_table_cells_and_json_carry_no_raw_control_character() -> None:
    text = table(("actor", "tags"), [(EVIL, "\x1b[8mhidden")])
    assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text
    dumped = to_json({"actor": EVIL})
    assert "\x1b" not in dumped and "\x9b" not in dumped
    assert json.loads(dumped) == {"actor": EVIL}
