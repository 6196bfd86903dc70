"""What an error may say where it is kept or shown: a failed job's error and
traceback (stored, then read by the API, the dashboard and `jobqueue
status`), the worker's log, a trace's span. The error itself, never the
values a statement was given.

A statement's values are the handler's data: a card number, an API key, a
customer's address. Three places echo them in an error's text, and none of
them is needed to tell what went wrong:

- **SQLAlchemy's `[parameters: ...]` line**, under every statement error.
  jobqueue's engines are made with `hide_parameters=True` (`db.create_engine`,
  the worker's lanes and threads); an error from an engine a handler made
  itself is shown as if its engine had been.
- **PostgreSQL's DETAIL and CONTEXT.** DETAIL holds row values by design
  (`Key (card)=(4111…) already exists`, `Failing row contains (...)`: the
  server itself leaves it out for a user who may not read those columns),
  and CONTEXT can quote a statement's parameters
  (`log_parameter_max_length_on_error`) or a COPY's line. A server's error
  is shown as its primary message, its SQLSTATE and its HINT.
- **Messages that quote the input.** A data exception (SQLSTATE class 22)
  quotes the text it could not read (`value "4111…" is out of range for type
  integer`): the quoted part is shown as `"…"`. asyncpg's own refusal of an
  argument it cannot encode quotes the argument's repr (`invalid input for
  query argument $2: 'sk_live…'`), and sometimes so does its cause (an
  invalid UUID): the argument is left out, and the cause too when it quotes it.

The text is rewritten, not the exceptions: every database error found in the
exception's chain (its causes, contexts and the driver's errors SQLAlchemy
wraps) gives the text it is printed as and the text to print instead, and
whatever text is about the exception (its message, its traceback, a
handler's own message that embeds `str(error)`) has the one replaced by the
other. A value a handler writes into an error of its own is its choice.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import asyncpg
from sqlalchemy.exc import StatementError

#: What replaces the input a data exception quotes.
HIDDEN_INPUT = '"…"'
#: What replaces an encoding error's cause when it quotes the argument.
HIDDEN_ARGUMENT = "the argument's value is not shown"
_ARGUMENT = re.compile(r"invalid input for query argument "
                       r"(\$\d+(?: in element #\d+ of executemany\(\) sequence)?): ", re.DOTALL)
_QUOTED = re.compile(r'".*"', re.DOTALL)


def cleaner(exc: BaseException) -> Callable[[str], str]:
    """A function that rewrites text about `exc` (its message, its
    traceback) without the values its database errors quote."""
    chain = list(_chain(exc))
    drivers = _Replacer(dict(pair for error in chain for pair in _rewrites(error)))
    # SQLAlchemy's message holds the driver's: shown without its parameters,
    # and with the driver's message as shown.
    return _Replacer({**drivers.shown, **{str(error): drivers(_without_parameters(error))
                                          for error in chain
                                          if isinstance(error, StatementError)}})


class _Replacer:
    """Replaces each key of `shown` in a text by its value: longest first,
    in one pass, so that a text holding another is replaced whole and
    nothing is replaced twice."""

    def __init__(self, shown: dict[str, str]) -> None:
        self.shown = {raw: safe for raw, safe in shown.items() if raw and raw != safe}
        self.pattern = (re.compile("|".join(map(re.escape, sorted(self.shown, key=len,
                                                                  reverse=True))))
                        if self.shown else None)

    def __call__(self, text: str) -> str:
        if self.pattern is None:
            return text
        return self.pattern.sub(lambda found: self.shown[found.group(0)], text)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and every exception printed with it or wrapped by it: causes,
    contexts (even a suppressed one: a handler's own message may quote it),
    a group's members, SQLAlchemy's `orig`."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        error = todo.pop()
        if id(error) in seen:
            continue
        seen.add(id(error))
        yield error
        linked = [error.__cause__, error.__context__, getattr(error, "orig", None),
                  *(error.exceptions if isinstance(error, BaseExceptionGroup) else ())]
        todo.extend(e for e in linked if isinstance(e, BaseException))


def _rewrites(error: BaseException) -> list[tuple[str, str]]:
    """(as printed, as shown) for one of the driver's exceptions in the chain."""
    if isinstance(error, asyncpg.DataError) and (found := _ARGUMENT.match(str(error))):
        return _argument(error, found)
    sqlstate = getattr(error, "sqlstate", None)
    primary = _primary(error)
    if not isinstance(sqlstate, str) or primary is None:
        return []
    if sqlstate.startswith("22"):  # a data exception: what it quotes is the input
        primary_shown = _QUOTED.sub(lambda _: HIDDEN_INPUT, primary)
    else:
        primary_shown = primary
    safe = f"{primary_shown} (SQLSTATE {sqlstate})"
    hint = _hint(error)
    if hint:
        safe += f"\nHINT:  {hint}"
    # asyncpg's error prints with its DETAIL and HINT, psycopg's with its
    # CONTEXT too; SQLAlchemy's wrapper of asyncpg's holds the primary alone.
    return [(str(error), safe), (primary, safe)]


def _without_parameters(error: StatementError) -> str:
    """SQLAlchemy's message as `hide_parameters=True` makes it."""
    if error.hide_parameters or error.params is None:
        return str(error)
    error.hide_parameters = True
    try:
        return str(error)
    finally:
        error.hide_parameters = False


def _argument(error: BaseException, found: re.Match[str]) -> list[tuple[str, str]]:
    """asyncpg's `invalid input for query argument $N: <repr> (<cause>)`,
    without the repr, and without the cause when that quotes the value."""
    text, cause = str(error), error.__cause__
    why = str(cause) if cause is not None else ""
    if cause is None or not text.endswith(f" ({why})"):
        return [(text, f"invalid input for query argument {found.group(1)}")]
    value = text[found.end():len(text) - len(why) - 3]
    value = value.removesuffix("...")  # asyncpg cuts a repr at 40 characters
    quoting = any(part and part in why for part in (value, value.strip("'\"")))
    why_shown = HIDDEN_ARGUMENT if quoting else why
    rewrites = [(text, f"invalid input for query argument {found.group(1)} ({why_shown})")]
    if quoting:
        rewrites.append((why, HIDDEN_ARGUMENT))
    return rewrites


def _primary(error: BaseException) -> str | None:
    """A server error's primary message: asyncpg's `message`, psycopg's
    `diag.message_primary`; None for anything else."""
    if isinstance(error, asyncpg.PostgresError):
        return str(error.args[0]) if error.args else None
    diag = getattr(error, "diag", None)
    primary = getattr(diag, "message_primary", None)
    return primary if isinstance(primary, str) else None


def _hint(error: BaseException) -> str | None:
    if isinstance(error, asyncpg.PostgresError):
        hint = getattr(error, "hint", None)
    else:
        hint = getattr(getattr(error, "diag", None), "message_hint", None)
    return hint if isinstance(hint, str) else None


def error_line(exc: BaseException) -> str:
    """`Class: message`, as Python prints an exception's last line, without
    the values its database errors quote."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return cleaner(exc)(text)
