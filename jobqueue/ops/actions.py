"""What an operator does to a job or a queue: retry, cancel, pause, resume,
limit. The HTTP API and the dashboard both act through here, so a retry or
a cancel means the same thing, and is refused for the same reasons, in both.

Each action runs in a transaction of its own on the connection given (which
must have none begun) and raises `NotFound` or `Conflict` with a sentence a
person can read; the callers turn those into a 404 or 409, or a message on
the page.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import TypeAlias

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from jobqueue import control
from jobqueue.enqueue import check_queue
from jobqueue.ops import held, routing
from jobqueue.schema.queries import queries

__all__ = ["UNIQUE_KEY_INDEX", "Conflict", "NotFound", "cancel", "change_queue", "retry"]

Executor: TypeAlias = AsyncConnection | AsyncSession
#: The partial unique index that keeps a unique key to one unfinished job (migration 0004).
UNIQUE_KEY_INDEX = "uq_jobs_unique_key"


class NotFound(LookupError):
    """No such job."""


class Conflict(Exception):
    """The job is not in a state the action applies to (the message says which)."""


async def retry(conn: Executor, job_id: uuid.UUID) -> None:
    """Run a failed job again: pending, due now, retries renewed, history kept.

    The unique index refuses a retry whose key another unfinished job took
    since: that is a Conflict naming the holder, not a database error."""
    try:
        async with conn.begin():
            for _ in range(2):  # again: moved to the history after the first one began
                retried = (await conn.execute(queries["api_retry_job"].text,
                                              {"id": job_id})).first()
                if retried is not None:
                    break
            if retried is None:
                await _refuse(conn, job_id, "only failed jobs can be retried")
    except IntegrityError as exc:
        if not _is_unique_key_conflict(exc):
            raise
        raise await _key_held(conn, job_id) from None


async def cancel(conn: Executor, job_id: uuid.UUID, reason: str | None,
                 wait: float) -> bool:
    """Cancel a job (`jobqueue.control.cancel`). True: it has ended (it was
    waiting, or its worker stopped it, or it finished first, within `wait`
    seconds); False: its worker was asked and has not answered yet."""
    async with conn.begin():
        try:
            outcome = await control.cancel(conn, job_id, reason)
        except LookupError:
            raise NotFound(f"no job {job_id}") from None
        except control.JobFinished as finished:
            raise Conflict(str(finished)) from None
    if outcome.cancelled:
        return True
    try:
        await control.wait(job_id, timeout=wait, database=_database_url(conn))
    except TimeoutError:
        return False
    return True


async def change_queue(conn: Executor, name: str,
                       change: Callable[[Executor, str], Awaitable[None]]) -> routing.Settings:
    """Apply `change` (`queues.pause`, `resume`, a `limit`) to a queue, and
    return the settings it left. A bad name is a ValueError."""
    check_queue(name)
    async with conn.begin():
        await change(conn, name)
        return (await routing.read_settings(conn)).get(name, routing.Settings())


async def _refuse(conn: Executor, job_id: uuid.UUID, rule: str) -> None:
    """Raise why a conditional update found nothing: NotFound, or Conflict
    with the status the API shows (a job a quick batch holds is running)."""
    status = await held.status_of(conn, job_id)
    if status is None:
        raise NotFound(f"no job {job_id}")
    raise Conflict(f"job {job_id} is {status}; {rule}")


def _is_unique_key_conflict(exc: IntegrityError) -> bool:
    """Whether the index of unique keys refused the statement (asyncpg names
    the constraint on the driver's error, which SQLAlchemy wraps)."""
    driver_error = getattr(exc.orig, "__cause__", None)
    return getattr(driver_error, "constraint_name", None) == UNIQUE_KEY_INDEX


async def _key_held(conn: Executor, job_id: uuid.UUID) -> Conflict:
    """The Conflict for a retry of a job whose unique key another unfinished
    job took meanwhile (read after the refused retry rolled back)."""
    async with conn.begin():
        job = (await conn.execute(queries["api_get_job"].text, {"id": job_id})).mappings().one()
        holder = (await conn.execute(queries["find_unique"].text,
                                     {"unique_key": job["unique_key"]})).scalar()
    return Conflict(f"job {job_id} cannot run again while unfinished job "
                    f"{holder or '(another)'} holds its unique key {job['unique_key']!r}")


def _database_url(conn: Executor) -> str:
    """The URL behind a connection or session: `wait` opens a connection of
    its own there (it LISTENs)."""
    if isinstance(conn, AsyncSession):
        return conn.sync_session.get_bind().engine.url.render_as_string(hide_password=False)
    return conn.engine.url.render_as_string(hide_password=False)
