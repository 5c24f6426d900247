"""SQL files read as code: comments and quoted text blanked, so that a statement is found only where it is one.

Used by the checks that read taskq's SQL files (the migration rules, the coverage of sql/roles.sql): a
function named in a comment or inside another function's body is not a definition.
"""

from __future__ import annotations

import re

_DOLLAR_TAG = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*)?\$")
_CREATE_ROUTINE = re.compile(
    r"\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:FUNCTION|PROCEDURE)\s+"
    r"(?:(?:\"[^\"]+\"|[A-Za-z_]\w*)\s*\.\s*)?(?P<name>\"[^\"]+\"|[A-Za-z_]\w*)",
    re.IGNORECASE,
)


def _blank(text: str) -> str:
    """The same number of characters, newlines kept (positions and line numbers still match)."""
    return re.sub(r"[^\n]", " ", text)


def code_only(text: str) -> str:
    """`text` with its comments, string literals and dollar-quoted bodies blanked (their delimiters kept).
    Double-quoted identifiers (and psql's :"variables") are kept: they are code."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if text.startswith("--", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            out.append(_blank(text[i:end]))
            i = end
        elif text.startswith("/*", i):  # block comments nest in PostgreSQL
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(_blank(text[i:j]))
            i = j
        elif ch == "'":
            escapes = i > 0 and text[i - 1] in "eE" and (i < 2 or not (text[i - 2].isalnum() or text[i - 2] == "_"))
            j = i + 1
            while j < n:
                if escapes and text[j] == "\\":
                    j += 2
                elif text[j] == "'":
                    if text.startswith("''", j):
                        j += 2
                    else:
                        break
                else:
                    j += 1
            out.append("'" + _blank(text[i + 1 : j]) + ("'" if j < n else ""))
            i = j + 1
        elif ch == '"':
            end = text.find('"', i + 1)
            end = n - 1 if end < 0 else end
            out.append(text[i : end + 1])
            i = end + 1
        elif ch == "$" and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            tag = _DOLLAR_TAG.match(text, i)
            if tag is None:
                out.append(ch)
                i += 1
                continue
            close = text.find(tag.group(0), tag.end())
            if close < 0:  # unterminated: the rest is the body
                out.append(tag.group(0) + _blank(text[tag.end() :]))
                break
            out.append(tag.group(0) + _blank(text[tag.end() : close]) + tag.group(0))
            i = close + len(tag.group(0))
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def routine_name(name: str) -> str:
    """A function's name as PostgreSQL stores it: a quoted name as written, an unquoted one in lower case."""
    return name[1:-1] if name.startswith('"') else name.lower()


def created_routines(text: str) -> list[str]:
    """The functions and procedures a SQL file creates (CREATE [OR REPLACE] FUNCTION|PROCEDURE), in order."""
    return [routine_name(m["name"]) for m in _CREATE_ROUTINE.finditer(code_only(text))]
