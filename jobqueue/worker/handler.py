"""What a handler sees while it runs: its session, `current_job()`, and what
becomes of what it returns or raises (`encode_result`, `error_text`).

The session is an `AsyncSession` whose writes commit with its job's
completion, in the lane's batch transaction, and roll back alone if the
handler fails.

A lane keeps one session for its life, in one SQLAlchemy transaction that
sends no SQL: the lane's connection is in autocommit mode, and the real
transaction is the lane's own, on the driver (`lane.py`). Hooks on the lane's
engine watch every statement a handler sends and decide what surrounds it.

A job runs one of two ways:

- **isolated**: just before the handler's first statement, `SAVEPOINT
  jobqueue_job`, sent as a simple query (one round trip, nothing prepared).
  It is never released: the next job's savepoint nests inside it, and
  `ROLLBACK TO SAVEPOINT jobqueue_job` always reaches the newest one, the
  failing job's, so its batch-mates keep their writes.
- **plain**: no savepoint at all, so a job that writes costs one round trip
  and one subtransaction less (`python -m jobqueue.benchmarks.ceiling`
  measures both). If a plain job fails after its handler touched the
  database, its writes cannot be undone alone: the lane rolls the whole batch
  back and runs the jobs before it again, isolated (`lane.py`), and from then
  on that job type runs isolated in this worker.

SQLAlchemy's own per-job savepoints (a session per job with
`join_transaction_mode="create_savepoint"`) are what this replaces: on asyncpg
each gets a fresh name (`sa_savepoint_1`, `_2`, …) and every statement is
prepared, so each SAVEPOINT and RELEASE is a new prepared statement, two round
trips and an eviction from the statement cache, plus a session transaction
begun and committed per job.

Each savepoint that writes gets a subtransaction id, and PostgreSQL keeps only
64 of them per backend in shared memory (`PGPROC_MAX_CACHED_SUBXIDS`); past
that, every other session's snapshots must look subtransactions up in
`pg_subtrans`, which slows the whole server. Every savepoint is counted (the
handler's own `begin_nested()` ones too), and the lane ends a batch before it
would open more than `pacing.SAVEPOINT_LIMIT` in one transaction.
"""

from __future__ import annotations

import datetime as dt
import traceback
import uuid
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, NamedTuple

import sqlalchemy.ext.asyncio
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import await_only

from jobqueue import codec
from jobqueue.enqueue import check_nul
from jobqueue.redact import cleaner, error_line
from jobqueue.schema.models import ERROR_MESSAGE_MAX_LENGTH, TIMEOUT_MAX, TRACEBACK_MAX_LENGTH
from jobqueue.schema.queries import queries
from jobqueue.worker.guard import refusal

#: How a job runs: its first statement opens its savepoint, or none does.
ISOLATED, PLAIN = "isolated", "plain"
#: Key in a lane session's `info` dict: a handler is running.
IN_HANDLER = "jobqueue_in_handler"


UNIX_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


class ClaimedJob(NamedTuple):
    """A job as a lane runs it (a tuple: built straight from the claimed row)."""

    id: uuid.UUID
    job_type: str
    payload: str
    retry_count: int
    max_retries: int
    timeout: float | None  # the job's own (seconds); None: its type's, if any
    priority: int
    #: When it was due, in microseconds since 1970 (exact): decoding a
    #: timestamp for every job of a 1,000-job batch cost the worker about
    #: 1.5 µs a job, and the time itself is needed only when jobs go back.
    due_us: int
    #: Where the lane's next claim at this priority may start (`floors.py`):
    #: a (run_at, id) pair, id None for the time alone; None from a
    #: statement that does not say.
    floor: dt.datetime | None
    floor_id: uuid.UUID | None
    #: Where its row version is (block, offset), from `take`/`retake`: a job
    #: locked by its batch's own transaction stays there until recorded
    #: (`complete_taken`); None from the statements that commit at once.
    tid: tuple[int, int] | None

    @property
    def run_at(self) -> dt.datetime:
        """When it was due."""
        return UNIX_EPOCH + dt.timedelta(microseconds=self.due_us)

    @property
    def attempt(self) -> int:
        """1 for the first run, 2 for the first retry, …"""
        return self.retry_count + 1


_current_job: ContextVar[ClaimedJob | None] = ContextVar("jobqueue_current_job", default=None)


def current_job() -> ClaimedJob:
    """The job the calling handler is running (its id, type, attempt).

    Handlers take (session, payload); this gives them the rest when they need
    it, for an idempotency key or a log line.
    """
    job = _current_job.get()
    if job is None:
        raise LookupError("current_job() is only available inside a handler")
    return job


def error_text(exc: BaseException) -> str:
    """The error as text PostgreSQL can store (no NUL, no lone surrogate),
    without the values its database errors quote (`redact.py`)."""
    return _storable(error_line(exc))[:ERROR_MESSAGE_MAX_LENGTH]


def traceback_text(exc: BaseException) -> str:
    """The error's traceback as Python prints it (its causes included),
    without the values its database errors quote (`redact.py`), as text
    PostgreSQL can store, at most TRACEBACK_MAX_LENGTH characters: a longer
    one loses its beginning, the outermost frames, and says so."""
    text = _storable(cleaner(exc)("".join(traceback.format_exception(exc))))
    if len(text) <= TRACEBACK_MAX_LENGTH:
        return text
    marker = "[… the traceback's beginning is cut]\n"
    return marker + text[len(text) - TRACEBACK_MAX_LENGTH + len(marker):]


def _storable(text: str) -> str:
    """No NUL and no lone surrogate: text PostgreSQL accepts."""
    return text.replace("\x00", "\\0").encode("utf-8", "backslashreplace").decode("utf-8")


def encode_result(result: Any) -> str | None:
    """A handler's result as the JSON text `complete` stores; TypeError when
    PostgreSQL could not store it (the job fails, not its batch)."""
    if result is None:
        return None
    try:
        encoded = codec.dumps(result)
        encoded.encode("utf-8")
        check_nul(encoded, "result")
    except (TypeError, ValueError) as e:  # UnicodeEncodeError is a ValueError
        raise TypeError(f"handler result is not JSON PostgreSQL can store: {e}") from None
    return encoded


class Snooze(Exception):  # noqa: N818 (a request, not an error: the name DESIGN.md pins)
    """Raise it in a handler to run the job again later: `raise Snooze(30)`.

    The attempt does not count: the job is due again in `seconds`, its retry
    count unchanged, and whatever the handler wrote rolls back as for a
    failure. For work that is not ready yet (a file still uploading, a
    partner's rate limit), where a failure would burn a retry and a backoff
    would guess the wait.
    """

    def __init__(self, seconds: float) -> None:
        if (isinstance(seconds, bool) or not isinstance(seconds, int | float)
                or not 0 <= seconds <= TIMEOUT_MAX):
            raise ValueError(f"Snooze takes seconds from 0 to {TIMEOUT_MAX:,}, got {seconds!r}")
        super().__init__(seconds)
        self.seconds = float(seconds)


class HandlerError(RuntimeError):
    """A handler left its session in a state the next job cannot start from."""


class HandlerCommitError(RuntimeError):
    """A handler tried to end its job's transaction: it called commit() on
    its session, or sent COMMIT, ROLLBACK and the like (`guard.py`). Its
    writes must commit with the job's completion, or a failure after the
    commit would leave them committed and the retry would write them again."""


#: The error of a handler that called commit() on its session.
COMMIT_REFUSED = "handlers must not commit: their writes commit with the job's completion"


class JobInterrupted(Exception):
    """The running handler is being stopped (its timeout, a cancel): its
    statements fail before they are sent (`interrupt.py`)."""


class SwallowedDatabaseError(Exception):
    """A handler caught a database error and returned as if it had succeeded.

    PostgreSQL has aborted the handler's savepoint by then, so none of its
    writes can commit; the job fails instead of pretending.
    """


#: Why a handler that returned inside a `begin_nested()` it opened fails:
#: left open, the next job's rollback would reach back into it.
NESTED_LEFT_OPEN = "the handler returned inside a begin_nested() it opened"


def result_of(result: Any, refused: str | None, db_error: bool) -> str | None:
    """A handler returned (its session flushed): may its job count as done?
    Its encoded result, or why it fails (raised); the same rules for async
    and sync handlers. `refused`: it tried to end its transaction;
    `db_error`: a statement of its failed and nothing undid that."""
    if refused is not None:
        raise HandlerCommitError(refused)
    if db_error:
        raise SwallowedDatabaseError(
            "the handler caught a database error and went on; its writes are void")
    return encode_result(result)


def lane_engine(url: str, lanes: int, application_name: str) -> AsyncEngine:
    """The engine a worker's lanes draw their connections from: one per lane,
    in autocommit mode, because lanes run their own transactions on the
    driver (`lane.py`) and SQLAlchemy must send no BEGIN or COMMIT of its own
    on them; with the hooks above. Its errors and its log never show a
    statement's values (`hide_parameters`, `redact.py` says why).
    (`create_async_engine` is looked up when called: `db.create_engine`
    says why.)"""
    engine = sqlalchemy.ext.asyncio.create_async_engine(
        url, pool_size=lanes, max_overflow=0, pool_pre_ping=False,
        isolation_level="AUTOCOMMIT", hide_parameters=True,
        connect_args={"server_settings": {"application_name": application_name}})
    sync = engine.sync_engine
    event.listen(sync, "before_cursor_execute", _before_statement)
    event.listen(sync, "after_cursor_execute", _after_statement)
    event.listen(sync, "rollback", _roll_back_job)
    event.listen(sync, "commit", _note_commit)
    event.listen(sync, "savepoint", _count_savepoint)
    event.listen(sync, "rollback_savepoint", _recovered)
    event.listen(sync, "handle_error", _mark_db_error)
    return engine


@dataclass
class LaneState:
    """What a lane connection's statement hooks know and decide: its batch
    transaction, and the job whose handler runs in it. One per lane
    connection (`state_of`), written by the lane and by the hooks below,
    read by both and by `interrupt.Stopper`."""

    #: Savepoints opened in the batch's transaction (the handlers' own too).
    savepoints: int = 0
    #: The transaction begins with the handler's next statement (`batch.Deferred`).
    begin_first: bool = False
    #: How the running job runs (ISOLATED, PLAIN), None between jobs.
    job: str | None = None
    #: An isolated job's savepoint is open.
    job_savepoint: bool = False
    #: The running job's handler sent a statement.
    touched: bool = False
    #: A plain job's session rolled back after its handler wrote: its writes
    #: are still in the batch and only rolling the batch back removes them.
    undo: bool = False
    #: Why the handler's attempt to end its job's transaction was refused: it
    #: committed its session's connection (nothing reached the server, the
    #: connection being in autocommit mode at SQLAlchemy's level, but its
    #: session no longer tracks its writes), or sent a statement that would
    #: have (`guard.py`). The job fails even if the handler caught the error.
    refused: str | None = None
    #: Why the running handler is being stopped (`interrupt.py`): its next
    #: statements fail before they are sent.
    interrupt: str | None = None
    #: A statement of the handler is on its way (a stop cancels it on the server).
    in_statement: bool = False
    #: A statement failed since the job started (a handler that catches the
    #: error and returns is failed: `SwallowedDatabaseError`).
    db_error: bool = False
    #: The handler added objects to its session (they may wait unflushed).
    #: Set by the session's `transient_to_pending` event, so a handler that
    #: uses no ORM objects costs no look at `session.new`, which builds a set.
    added: bool = False

    def start_transaction(self, begun: bool = True) -> None:
        """A new batch transaction: no savepoint open yet; not `begun`: the
        handler's first statement begins it."""
        self.savepoints = 0
        self.job = None
        self.begin_first = not begun

    def start_job(self, isolated: bool) -> None:
        """A handler is about to run, isolated (its first statement opens its
        savepoint) or plain."""
        self.job = ISOLATED if isolated else PLAIN
        self.job_savepoint = self.touched = self.undo = self.db_error = self.added = False
        self.refused = None

    def end_job(self) -> None:
        self.job = None
        self.job_savepoint = False

    async def roll_back_job(self, raw: Any) -> None:
        """Undo an isolated handler's writes on the driver directly, if its
        savepoint is still open (its session's own rollback usually did it)."""
        if self.job_savepoint:
            await raw.execute(queries["job_rollback"].sql)
            self.job_savepoint = False


def state_of(info: dict[Any, Any]) -> LaneState:
    """The lane state kept in a lane connection's `info` (made on first use)."""
    state = info.get(LaneState)
    if state is None:
        state = info[LaneState] = LaneState()
    return state


def refuse_handler_commit(session: Any) -> None:
    """SQLAlchemy `before_commit` hook on a lane's session (a savepoint of the
    handler's own, `begin_nested()`, commits as usual: it releases that
    savepoint only)."""
    if session.info.get(IN_HANDLER) and not session.in_nested_transaction():
        raise HandlerCommitError(COMMIT_REFUSED)


# -- the engine's hooks (SQLAlchemy calls them in its greenlet, so they may
# -- wait on the driver with `await_only`, as its asyncpg adapter does) --------


def _before_statement(conn: Any, cursor: Any, statement: str, parameters: Any,
                      context: Any, executemany: bool) -> None:
    state = state_of(conn.info)
    if state.job is None:
        return
    if state.interrupt is not None:
        raise JobInterrupted(state.interrupt)
    if (reason := refusal(statement)) is not None:
        state.refused = reason
        raise HandlerCommitError(reason)
    state.touched = True
    first = []  # what must precede the statement, sent as one simple query
    if state.begin_first:
        first.append("BEGIN")  # the batch's transaction (`batch.Deferred`)
    opens = state.job == ISOLATED and not state.job_savepoint
    if opens:
        first.append(queries["job_savepoint"].sql)
    if first:
        _simple(conn, "; ".join(first))
        state.begin_first = False
        if opens:
            state.job_savepoint = True
            state.savepoints += 1
    state.in_statement = True


def _after_statement(conn: Any, cursor: Any, statement: str, parameters: Any,
                     context: Any, executemany: bool) -> None:
    state_of(conn.info).in_statement = False


def _roll_back_job(conn: Any) -> None:
    """The session rolled back (the handler's own call, or the lane's after a
    failure): undo the job's writes."""
    state = state_of(conn.info)
    if state.job is None:  # not a handler's session: the lane closing, say
        return
    if state.job_savepoint:
        _simple(conn, queries["job_rollback"].sql)
        state.job_savepoint = False  # the handler's next statement opens a new one
    elif state.job == PLAIN and state.touched:
        state.undo = True


def _note_commit(conn: Any) -> None:
    state = state_of(conn.info)
    if state.job is not None:
        state.refused = COMMIT_REFUSED


def _recovered(conn: Any, name: str, context: Any) -> None:
    """The handler rolled back to a savepoint of its own: an error inside it is
    undone with it (PostgreSQL's way to recover), so it no longer fails the
    job. (Any savepoint still open when a statement fails encloses it; if the
    ROLLBACK TO itself fails, `handle_error` marks the connection again.)"""
    state_of(conn.info).db_error = False


def _count_savepoint(conn: Any, name: str | None) -> None:
    state_of(conn.info).savepoints += 1


def _mark_db_error(context: Any) -> None:
    """Remember which connection saw an error (a handler that catches it and
    returns is failed: `SwallowedDatabaseError`)."""
    if context.connection is not None:
        state = state_of(context.connection.info)
        state.db_error = True
        state.in_statement = False


def _simple(conn: Any, sql: str) -> None:
    """One statement as a simple query on the driver's connection."""
    try:
        await_only(conn.connection.driver_connection.execute(sql))
    except Exception:
        state_of(conn.info).db_error = True
        raise
