"""Waiting for a job to finish, and cancelling one.

    job = await jobqueue.wait(job_id, timeout=10)     # DATABASE_URL, or database=URL or engine
    if job.status == "completed": print(job.result)

    async with engine.begin() as conn:                # in your transaction, like enqueue()
        outcome = await jobqueue.control.cancel(conn, job_id, reason="customer left")
    if not outcome.cancelled:                         # a worker has it: it was asked to stop
        job = await jobqueue.wait(job_id, timeout=2, database=engine)

`wait` listens; it does not poll. It writes a row in `jobqueue_waiters`,
LISTENs on `jobqueue_done`, then reads the job once (a job that finished
before the LISTEN is not missed), and sleeps until a notification names its
job. The statements that finish jobs (`complete`, `fail`, `cancel` and
`rescue` in queries.sql) notify the jobs that have a waiter's row, so when
nobody waits they pay one probe of an empty table per batch.

Why `wait` opens a connection of its own instead of taking the caller's
session: LISTEN belongs to a connection, and notifications arrive only
between its transactions. A pooled connection would go back to the pool
still listening, and a session in a transaction would hear nothing until it
ends. So `wait` takes where the database is (a URL, an engine whose URL it
uses, or `DATABASE_URL` like `JobRunner`) and keeps one dedicated
connection for as long as it waits. `cancel`, which only writes, runs in the
caller's transaction like `enqueue` and `queues.pause`: its notification
goes out when that transaction commits.

`wait` returns a `FinishedJob`, a frozen dataclass, rather than the ORM
`Job`: it is a snapshot of an outcome, not a row to change. It needs no
session, cannot be flushed back by accident, and does not pull in the HTTP
API's models (an optional extra).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, NamedTuple, TypeVar, overload

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine

from jobqueue import db
from jobqueue.enqueue import Executor, check_strings
from jobqueue.schema.locks import CANCELLED, DONE_CHANNEL
from jobqueue.schema.models import ERROR_MESSAGE_MAX_LENGTH, JobStatus
from jobqueue.schema.queries import queries
from jobqueue.tasks import TaskJob

logger = logging.getLogger(__name__)

R = TypeVar("R")

#: Longest reason a cancel keeps (error_message holds `cancelled: ` before it).
REASON_MAX_LENGTH = ERROR_MESSAGE_MAX_LENGTH - len(CANCELLED) - 2
#: The states a job does not leave by itself: what `wait` waits for.
FINISHED = frozenset({JobStatus.COMPLETED, JobStatus.FAILED})
#: The state a job can be cancelled in at once, if no worker holds it.
WAITING = frozenset({JobStatus.PENDING, JobStatus.RETRYING})

#: A waiter reads the job again if no notification came for this long, then
#: twice as long, up to RECHECK_MAX: a safety net, not the mechanism (see
#: `wait`), so that a notification the finisher could not send costs seconds,
#: not the whole timeout.
RECHECK_FIRST = 1.0
RECHECK_MAX = 30.0
#: How long a waiter that is leaving gives its connection to delete its row.
_LEAVE_TIMEOUT = 2.0

Database = str | AsyncEngine | None


@dataclass(frozen=True)
class FinishedJob(Generic[R]):
    """A job as it ended: `completed` (with its handler's `result`) or
    `failed` (with `error_message` and every failed attempt in
    `error_history`; a cancelled job too, see `cancelled`). Waited for by a
    task's `TaskJob`, `result` is the task's return type; a failed job's is
    None."""

    id: uuid.UUID
    job_type: str
    queue: str
    status: JobStatus
    result: R
    error_message: str | None
    error_history: list[dict[str, Any]]
    retry_count: int
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None

    @property
    def cancelled(self) -> bool:
        """Whether it ended because someone cancelled it."""
        return is_cancel_message(self.status, self.error_message)

    @staticmethod
    def from_row(row: asyncpg.Record) -> FinishedJob[Any]:
        return FinishedJob[Any](id=row["id"], job_type=row["job_type"], queue=row["queue"],
                   status=JobStatus(row["status"]),
                   result=None if row["result"] is None else json.loads(row["result"]),
                   error_message=row["error_message"],
                   error_history=json.loads(row["error_history"]),
                   retry_count=row["retry_count"], created_at=row["created_at"],
                   started_at=row["started_at"], completed_at=row["completed_at"])


def is_cancel_message(status: str, error_message: str | None) -> bool:
    """A failed job whose error is a cancel's (`cancelled`, `cancelled: …`)."""
    return status == JobStatus.FAILED and error_message is not None and (
        error_message == CANCELLED or error_message.startswith(f"{CANCELLED}: "))


def as_job_id(job_id: object) -> uuid.UUID:
    """A job id from a UUID or its text, or a ValueError."""
    if isinstance(job_id, uuid.UUID):
        return job_id
    if isinstance(job_id, str):
        try:
            return uuid.UUID(job_id)
        except ValueError:
            pass
    raise ValueError(f"not a job id: {job_id!r}")


def _url(database: Database) -> str:
    if isinstance(database, AsyncEngine):
        return database.url.render_as_string(hide_password=False)
    return db.database_url(database)


@overload
async def wait(job_id: TaskJob[Awaitable[R]], *, timeout: float | None = None,
               database: Database = None) -> FinishedJob[R]: ...


@overload
async def wait(job_id: TaskJob[R], *, timeout: float | None = None,
               database: Database = None) -> FinishedJob[R]: ...


@overload
async def wait(job_id: uuid.UUID | str, *, timeout: float | None = None,
               database: Database = None) -> FinishedJob[Any]: ...


async def wait(job_id: uuid.UUID | str, *, timeout: float | None = None,
               database: Database = None) -> FinishedJob[Any]:
    """The job once it has finished (completed or failed; `retrying` is not
    finished), or TimeoutError after `timeout` seconds (None: no limit);
    LookupError if there is no such job. For a task's job (what
    `charge.enqueue` returns) a completed job's result is read back as the
    task's return type.

    `database`: a URL, an engine (its URL: `wait` opens a connection of its
    own, see the module's docstring), or None for `DATABASE_URL`.

    One race a notification cannot cover: a `complete` or `fail` statement
    that started before this waiter's row was committed does not see it, and
    if it reaches this job's row only after `wait` has read it, nothing is
    sent. A quick batch cannot do that (its jobs are locked before the
    statement starts, and the read waits for the lock); a batch of claimed
    jobs can, in the few milliseconds from that statement's start to its
    commit (the read does not wait for an update, `queries.sql:
    wait_check`). For that,
    `wait` reads the job again when no notification came for 1 s, then 2 s,
    4 s, … up to 30 s: such a miss costs a second or so, not the timeout.
    """
    job_id = as_job_id(job_id)
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                                or not timeout > 0):
        raise ValueError(f"timeout must be a number of seconds above 0, or None, "
                         f"not {timeout!r}")
    url = _url(database)
    deadline = asyncio.timeout(timeout)
    try:
        async with deadline:
            finished = await _wait(url, job_id)
    except TimeoutError:
        if not deadline.expired():
            raise  # not the deadline's: a connect timeout, say
        raise TimeoutError(f"job {job_id} did not finish within {timeout:g} s") from None
    if isinstance(job_id, TaskJob) and finished.status == JobStatus.COMPLETED:
        finished = dataclasses.replace(finished, result=job_id.task.decode_result(finished.result))
    return finished


async def _wait(url: str, job_id: uuid.UUID) -> FinishedJob[Any]:
    conn = await db.connect(url, application_name="jobqueue wait")
    heard = asyncio.Event()
    key = str(job_id)

    def on_notify(_conn: object, _pid: int, _channel: str, payload: str) -> None:
        if payload == key:
            heard.set()

    try:
        await queries["wait_register"].execute(conn, job_id=job_id)
        await conn.add_listener(DONE_CHANNEL, on_notify)
        recheck = RECHECK_FIRST
        while True:
            heard.clear()  # before the read: a notification during it still counts
            row = await queries["wait_check"].fetchrow(conn, job_id=job_id)
            if row is None:  # or moved to the history after the read began: read again
                row = await queries["wait_check"].fetchrow(conn, job_id=job_id)
            if row is None:
                raise LookupError(f"no job {job_id}")
            if row["status"] in FINISHED:
                return FinishedJob.from_row(row)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(recheck):
                    await heard.wait()
            if not heard.is_set():
                logger.debug("job %s: no notification for %.0f s; reading it again",
                             job_id, recheck)
                recheck = min(recheck * 2, RECHECK_MAX)
    finally:
        await _leave(conn, job_id)


async def _leave(conn: asyncpg.Connection, job_id: uuid.UUID) -> None:
    """Delete this waiter's row and close. A connection cut, or busy with a
    statement a timeout interrupted, is dropped instead: its row then goes
    with the leader's next `archive` (its backend is gone)."""
    try:
        async with asyncio.timeout(_LEAVE_TIMEOUT):
            await queries["wait_forget"].execute(conn, job_id=job_id)
            await conn.close()
    except Exception:
        conn.terminate()
    except asyncio.CancelledError:
        conn.terminate()
        raise


def check_reason(reason: object) -> str | None:
    """A cancel's reason (kept in error_message), or a ValueError."""
    if reason is None or reason == "":
        return None
    if not isinstance(reason, str):
        raise ValueError(f"reason must be a string, not {type(reason).__name__}")
    if len(reason) > REASON_MAX_LENGTH:
        raise ValueError(f"reason is {len(reason):,} characters long; "
                         f"the limit is {REASON_MAX_LENGTH:,}")
    check_strings(reason, "reason")
    try:
        reason.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("reason contains a lone surrogate, which is not valid Unicode") from None
    return reason


class JobFinished(Exception):
    """The job had finished before the cancel: nothing to cancel."""

    def __init__(self, job_id: uuid.UUID, status: JobStatus) -> None:
        super().__init__(f"job {job_id} is {status}; it has finished, so there is nothing "
                         "to cancel")
        self.job_id = job_id
        self.status = status


class Cancellation(NamedTuple):
    """What `cancel` did. `cancelled`: the job was waiting and is now failed
    with error_message `cancelled`; False: a worker has it (`was`
    processing, or pending but locked in a quick batch), and the worker was
    asked to stop it, which `wait` tells the outcome of."""

    job_id: uuid.UUID
    was: JobStatus
    cancelled: bool


async def cancel(session: Executor, job_id: uuid.UUID | str,
                 reason: str | None = None) -> Cancellation:
    """Cancel a job in the caller's transaction (nothing is committed here).

    A waiting job (pending or retrying) that no worker holds ends `failed`
    at once, error_message `cancelled` (`cancelled: <reason>`), without an
    attempt in its history. A job a worker has is asked to stop: a NOTIFY
    `cancel:<id>` to the workers when the transaction commits; the worker
    records `cancelled` (the reason does not travel with it) and none of
    the handler's writes commit, wherever the job is in the worker
    (`worker/cancels.py`: not started yet, running, done in a batch that
    has not committed, to be retried, or let go still waiting). Not a
    guarantee: a job whose batch was already recording its outcome has
    finished first, and a worker that is not listening at that moment
    (restarting, reconnecting) never hears it. Commit soon: the request
    leaves only then. Never waits for a worker's lock.

    LookupError: no such job. JobFinished: it had already finished.
    """
    job_id = as_job_id(job_id)
    reason = check_reason(reason)
    message = CANCELLED if reason is None else f"{CANCELLED}: {reason}"
    row = (await session.execute(queries["cancel"].text,
                                 {"id": job_id, "error_message": message})).first()
    if row is None:
        raise LookupError(f"no job {job_id}")
    was = JobStatus(row.was)
    if not row.cancelled and was in FINISHED:
        raise JobFinished(job_id, was)
    return Cancellation(job_id, was, bool(row.cancelled))
