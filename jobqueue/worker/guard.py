"""Statements a handler may not send: those that would end the transaction its
job's completion commits in, or move the savepoint that undoes its writes.

A handler's writes are atomic with its job's completion because both are in
one transaction that the worker commits. A handler that sends `COMMIT` (or
`END`, `ROLLBACK`, `PREPARE TRANSACTION`, …) itself would commit its
batch-mates' writes and its own before any of them is recorded, so a failure
after it leaves the writes behind and the retry writes them again. SQLAlchemy
never sees such a statement as a commit: it is only text. So the statement
hooks of both kinds of lane (`handler.py`, `threads.py`) ask `refusal` about
every statement a handler sends, and a refused one fails the job before it
reaches the server.

A statement is read the way PostgreSQL splits it: comments and quoted text
are skipped, and each `;`-separated command is looked at (psycopg sends a
string of several commands as one simple query when it has no parameters).
Commands that run code (`DO`, `CALL`) cannot end a transaction from inside a
transaction block: PostgreSQL refuses those itself.
"""

from __future__ import annotations

import functools
import re

#: The savepoint the worker opens before an isolated job's first statement
#: (`queries.sql`: job_savepoint); a handler's own must have other names.
JOB_SAVEPOINT = "jobqueue_job"

#: Commands that end the transaction (or begin one, which means the handler
#: believes it manages its own).
_ENDING = {"commit", "end", "abort", "begin", "start"}

_WORD = re.compile(r'\s*("(?:[^"]|"")*"|[A-Za-z_][A-Za-z_0-9$]*)')


@functools.lru_cache(maxsize=4096)
def refusal(statement: str) -> str | None:
    """Why a handler may not send `statement` (None: it may). Cached: a
    handler's statements repeat, and this runs before each of them."""
    for command in _commands(statement):
        words = _words(command, 4)
        if not words:
            continue
        first = words[0]
        if first in _ENDING or (first == "rollback" and words[1:2] != ["to"]) or (
                first == "prepare" and words[1:2] == ["transaction"]):
            what = {"prepare": "PREPARE TRANSACTION", "start": "START TRANSACTION"
                    }.get(first, first.upper())
            return (f"handlers must not run {what}: their writes commit with the job's "
                    "completion, in the worker's transaction")
        if _savepoint_named(words) == JOB_SAVEPOINT:
            return (f"handlers must not use the savepoint {JOB_SAVEPOINT}: it is the "
                    "worker's, and undoes the job's writes if it fails")
    return None


def _savepoint_named(words: list[str]) -> str | None:
    """The savepoint a SAVEPOINT, RELEASE [SAVEPOINT] or ROLLBACK TO
    [SAVEPOINT] command names (None for any other command)."""
    keyword = {"savepoint": 1, "release": 1, "rollback": 2}.get(words[0])
    if keyword is None:
        return None
    name = words[keyword:]
    if name[:1] == ["savepoint"] and words[0] != "savepoint":
        name = name[1:]
    return name[0] if name else None


def _words(command: str, n: int) -> list[str]:
    """The first `n` words of a command, unquoted identifiers lowercased."""
    words: list[str] = []
    at = 0
    while len(words) < n and (match := _WORD.match(command, at)):
        word = match.group(1)
        words.append(word[1:-1].replace('""', '"') if word.startswith('"') else word.lower())
        at = match.end()
    return words


def _commands(statement: str) -> list[str]:
    """The commands of `statement` without their comments, split at each `;`
    outside quotes, comments and dollar-quoted text; the text inside quotes
    is kept (it may be a quoted savepoint name)."""
    if "--" not in statement and "/*" not in statement and ";" not in statement:
        return [statement]  # the common case: one command, nothing to skip
    commands: list[str] = []
    current: list[str] = []
    i, n = 0, len(statement)
    while i < n:
        c = statement[i]
        if c == ";":
            commands.append("".join(current))
            current = []
            i += 1
        elif statement.startswith("--", i):
            end = statement.find("\n", i)
            i = n if end < 0 else end + 1
            current.append(" ")
        elif statement.startswith("/*", i):
            i = _comment_end(statement, i)
            current.append(" ")
        elif c in "'\"":
            end = _quote_end(statement, i, c)
            current.append(statement[i:end])
            i = end
        elif c == "$" and (tag := re.match(r"\$(?:[A-Za-z_][A-Za-z_0-9]*)?\$", statement[i:])):
            close = statement.find(tag.group(0), i + len(tag.group(0)))
            end = n if close < 0 else close + len(tag.group(0))
            current.append(" ")
            i = end
        else:
            current.append(c)
            i += 1
    commands.append("".join(current))
    return commands


def _comment_end(text: str, i: int) -> int:
    """Where a /* comment */ starting at `i` ends (they nest in PostgreSQL)."""
    depth, i = 0, i
    while i < len(text):
        if text.startswith("/*", i):
            depth, i = depth + 1, i + 2
        elif text.startswith("*/", i):
            depth, i = depth - 1, i + 2
            if depth == 0:
                return i
        else:
            i += 1
    return i


def _quote_end(text: str, i: int, quote: str) -> int:
    """Where a quoted string or identifier starting at `i` ends (a doubled
    quote stays inside; a backslash escapes in E'' strings)."""
    escapes = quote == "'" and i > 0 and text[i - 1] in "eE"
    j = i + 1
    while j < len(text):
        if escapes and text[j] == "\\":
            j += 2
        elif text[j] == quote:
            if text.startswith(quote * 2, j):
                j += 2
            else:
                return j + 1
        else:
            j += 1
    return j
