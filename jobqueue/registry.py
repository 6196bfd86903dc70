"""Handlers by job type, and the schedules of those that recur.

A handler is `async def handler(session, payload) -> result`. The session is an
`AsyncSession` whose work runs inside a savepoint of the worker's batch
transaction: what the handler writes commits together with the job's
completion, or rolls back alone if the handler fails.

`register(..., cron=...)` or `every=...` also makes the type recur
(`schedules.py`); the maintenance leader of whichever worker imports the
module enqueues its ticks (`worker/scheduler.py`). `register(...,
timeout=120)` gives the type's jobs a default timeout: a job's own
(`enqueue(..., timeout=)`) wins over it.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from jobqueue.enqueue import check_job_type, check_timeout
from jobqueue.schedules import ScheduleSpec
from jobqueue.schema.models import DEFAULT_QUEUE

logger = logging.getLogger(__name__)

JobHandler = Callable[[AsyncSession, dict[str, Any]], Awaitable[Any]]


class HandlerRegistry:
    """Which coroutine runs which job type."""

    def __init__(self) -> None:
        self._handlers: dict[str, JobHandler] = {}
        self._schedules: dict[str, ScheduleSpec] = {}
        self._timeouts: dict[str, float] = {}

    def register(self, job_type: str, *, cron: str | None = None, every: int | None = None,
                 queue: str | None = None, priority: int | None = None,
                 timeout: float | None = None) -> Callable[[JobHandler], JobHandler]:
        """Decorator: `@handlers.register("send_email")`.

        With `cron="0 3 * * *"` (five fields, UTC) or `every=60` (seconds), the
        type also recurs: one job per tick, fleet-wide, in `queue` with
        `priority`. Those two apply to the scheduled jobs only (`enqueue`
        takes its own), so they are refused without a schedule. Everything is
        checked here, before the function is even decorated: a bad schedule
        is a ValueError at the line that registers it, and nothing is kept.

        `timeout`: seconds one attempt of this type may run, for jobs that
        have no timeout of their own (the same rules as `enqueue`'s).
        Registering the type again without it drops the default.
        """
        check_job_type(job_type)
        default_timeout = check_timeout(timeout, f"timeout for {job_type!r}")
        spec = None
        if cron is not None or every is not None:
            spec = ScheduleSpec(cron=cron, every=every,
                                queue=DEFAULT_QUEUE if queue is None else queue,
                                priority=0 if priority is None else priority)
        elif queue is not None or priority is not None:
            raise ValueError(f"queue and priority apply to scheduled jobs: register "
                             f"{job_type!r} with cron= or every=, or pass them to enqueue()")

        def decorator(func: JobHandler) -> JobHandler:
            self.add(job_type, func)
            if spec is None:
                self._schedules.pop(job_type, None)
            else:
                self._schedules[job_type] = spec
            if default_timeout is None:
                self._timeouts.pop(job_type, None)
            else:
                self._timeouts[job_type] = default_timeout
            return func

        return decorator

    def add(self, job_type: str, func: JobHandler) -> None:
        check_job_type(job_type)
        if not inspect.iscoroutinefunction(func):
            raise TypeError(f"handler for {job_type!r} must be an async function")
        if job_type in self._handlers and self._handlers[job_type] is not func:
            logger.warning("handler for %r replaced by %s", job_type, func.__qualname__)
        self._handlers[job_type] = func

    def remove(self, job_type: str) -> None:
        self._handlers.pop(job_type, None)
        self._schedules.pop(job_type, None)
        self._timeouts.pop(job_type, None)

    @property
    def schedules(self) -> Mapping[str, ScheduleSpec]:
        """The recurring job types and their schedules (read-only)."""
        return MappingProxyType(self._schedules)

    def timeout(self, job_type: str) -> float | None:
        """The type's default timeout in seconds (None: none); a job's own
        timeout, when it has one, wins over it."""
        return self._timeouts.get(job_type)

    def get(self, job_type: str) -> JobHandler | None:
        return self._handlers.get(job_type)

    def __contains__(self, job_type: object) -> bool:
        return job_type in self._handlers

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._handlers))

    def __len__(self) -> int:
        return len(self._handlers)


#: The registry `jobqueue worker` uses; `--import` loads modules that fill it.
handlers = HandlerRegistry()
