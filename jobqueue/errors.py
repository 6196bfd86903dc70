"""Telling a lost connection from a real error, and waiting before retrying."""

from __future__ import annotations

import asyncio
import random

import asyncpg
from sqlalchemy.exc import DBAPIError

from jobqueue.redact import cleaner

# What a restart, a dropped connection or an unreachable server looks like.
# 57P01-57P03 (admin shutdown, crash shutdown, cannot connect now) arrive as
# errors from the server itself. InternalClientError ("another operation is in
# progress") is what asyncpg raises when a connection was cut under a query it
# has not finished reading: the connection is unusable either way; its
# TargetServerAttributeNotMatched says a server is not the one asked for (a
# standby, for read-write). 25006, a write refused as read-only, means the
# server reached is a standby (a failover moved the primary, or a URL or a
# DNS name still names the old one): start over and look for the primary.
_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.ReadOnlySQLTransactionError,
)


def _causes(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        if isinstance(current, DBAPIError) and current.orig is not None:
            current = current.orig
        else:
            current = current.__cause__
    return seen


def is_connection_error(exc: BaseException) -> bool:
    """True when the database went away (retry later), not when a statement
    or a handler failed on its own."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    # 57014 (a statement timeout, pg_cancel_backend) is filed under operator
    # intervention too, but only the statement ended: the connection is fine.
    return any(isinstance(e, _CONNECTION_ERRORS) and not isinstance(e, asyncpg.QueryCanceledError)
               for e in _causes(exc))


#: What to do about a database without the schema (`is_missing_schema`).
MIGRATE_HINT = "the database has no jobqueue schema yet; run `jobqueue migrate`"


def is_missing_schema(exc: BaseException) -> bool:
    """True when a statement named a table that is not there (SQLSTATE
    42P01): a database nobody ran `jobqueue migrate` on."""
    return any("42P01" in (getattr(e, "sqlstate", None), getattr(e, "pgcode", None))
               for e in _causes(exc))


def is_lock_contention(exc: BaseException) -> bool:
    """True when a statement gave up on a lock (lock_timeout, SQLSTATE
    55P03) or was chosen to end a deadlock (40P01): nothing is wrong with
    it, and it may be tried again once the other holder is done."""
    return any({getattr(e, "sqlstate", None), getattr(e, "pgcode", None)} & {"55P03", "40P01"}
               for e in _causes(exc))


def is_statement_timeout(exc: BaseException) -> bool:
    """True when the server ended a statement that ran past its
    statement_timeout (SQLSTATE 57014): the read was too heavy, the
    connection is fine."""
    return any(isinstance(e, asyncpg.QueryCanceledError) for e in _causes(exc))


def is_timeout(exc: BaseException) -> bool:
    """True when the client gave up waiting (its own timeout): the server did
    not answer at all, unlike a statement timeout, which is its answer."""
    return any(isinstance(e, asyncio.TimeoutError) for e in _causes(exc))


def one_line(exc: BaseException) -> str:
    """The innermost cause, on one line, for a log or an error message
    (without the values a database error quotes: `redact.py`)."""
    root = _causes(exc)[-1]
    text = cleaner(exc)(str(root)).strip().splitlines()
    return f"{type(root).__name__}: {text[0]}" if text else type(root).__name__


class Backoff:
    """Exponential delays with jitter for reconnecting: 0.1 s, 0.2 s, … 5 s."""

    def __init__(self, first: float = 0.1, cap: float = 5.0) -> None:
        self.first = first
        self.cap = cap
        self.attempt = 0

    def next(self) -> float:
        delay = min(self.cap, self.first * 2**self.attempt)
        self.attempt += 1
        return delay * random.uniform(0.5, 1.0)

    def reset(self) -> None:
        self.attempt = 0


def shown(value: object, limit: int = 40) -> str:
    """`value` as an error message quotes it: its repr, cut to `limit`
    characters. A message names what is wrong; echoing a megabyte of input
    back (a 422 of 900 KB) helps nobody."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 1]}…"
