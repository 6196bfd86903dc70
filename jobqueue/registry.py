"""Handlers by job type, and the schedules of those that recur.

A handler is `async def handler(session, payload) -> result`. The session is an
`AsyncSession` whose work runs inside a savepoint of the worker's batch
transaction: what the handler writes commits together with the job's
completion, or rolls back alone if the handler fails.

A plain `def handler(session, payload)` is a *sync* handler, for code that
blocks (requests, boto3, an ORM without async): it runs in a thread of the
worker's bounded pool, off the event loop, with a sync `Session` whose
transaction also records the job's outcome (`worker/threads.py`).

`register(..., cron=...)` or `every=...` also makes the type recur
(`schedules.py`); the maintenance leader of whichever worker imports the
module enqueues its ticks (`worker/scheduler.py`). `register(...,
timeout=120)` gives the type's jobs a default timeout: a job's own
(`enqueue(..., timeout=)`) wins over it.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession

from jobqueue.enqueue import check_job_type, check_timeout
from jobqueue.schedules import ScheduleSpec
from jobqueue.schema.models import DEFAULT_QUEUE

logger = logging.getLogger(__name__)

JobHandler = Callable[[AsyncSession, dict[str, Any]], Awaitable[Any]]
#: A plain `def handler(session, payload)`, given a sync `sqlalchemy.orm.Session`.
SyncJobHandler = Callable[..., Any]
_Handler = TypeVar("_Handler", bound=Callable[..., Any])


class HandlerRegistry:
    """Which function runs which job type (a coroutine function, or a plain
    one that runs in a thread)."""

    def __init__(self) -> None:
        self._handlers: dict[str, JobHandler | SyncJobHandler] = {}
        self._sync: set[str] = set()
        self._schedules: dict[str, ScheduleSpec] = {}
        self._timeouts: dict[str, float] = {}

    def register(self, job_type: str, *, cron: str | None = None, every: int | None = None,
                 queue: str | None = None, priority: int | None = None,
                 timeout: float | None = None) -> Callable[[_Handler], _Handler]:
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

        def decorator(func: _Handler) -> _Handler:
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

    def add(self, job_type: str, func: JobHandler | SyncJobHandler) -> None:
        """Register `func` for `job_type`: a coroutine function, or a plain
        function (a sync handler). Anything else is a TypeError here, at
        registration, rather than a failure of every job later."""
        check_job_type(job_type)
        sync = _is_sync(job_type, func)
        if job_type in self._handlers and self._handlers[job_type] is not func:
            logger.warning("handler for %r replaced by %s", job_type,
                           getattr(func, "__qualname__", repr(func)))
        self._handlers[job_type] = func
        if sync:
            self._sync.add(job_type)
        else:
            self._sync.discard(job_type)

    def remove(self, job_type: str) -> None:
        self._handlers.pop(job_type, None)
        self._sync.discard(job_type)
        self._schedules.pop(job_type, None)
        self._timeouts.pop(job_type, None)

    def is_sync(self, job_type: str) -> bool:
        """Is the type's handler a plain function (run in a thread)?"""
        return job_type in self._sync

    @property
    def schedules(self) -> Mapping[str, ScheduleSpec]:
        """The recurring job types and their schedules (read-only)."""
        return MappingProxyType(self._schedules)

    def timeout(self, job_type: str) -> float | None:
        """The type's default timeout in seconds (None: none); a job's own
        timeout, when it has one, wins over it."""
        return self._timeouts.get(job_type)

    def get(self, job_type: str) -> JobHandler | SyncJobHandler | None:
        return self._handlers.get(job_type)

    def __contains__(self, job_type: object) -> bool:
        return job_type in self._handlers

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._handlers))

    def __len__(self) -> int:
        return len(self._handlers)


def _is_sync(job_type: str, func: object) -> bool:
    """False for a coroutine function, True for a plain function (or a method,
    or a partial of either); TypeError for anything else, and for kinds that
    look like functions but cannot be a handler (generators, and a plain
    function that wraps a coroutine function: a decorator that is not async-
    aware would make every job return an unawaited coroutine)."""
    if inspect.iscoroutinefunction(func):
        return False
    inner = func
    while isinstance(inner, functools.partial):
        inner = inner.func
    if inspect.isasyncgenfunction(inner) or inspect.isgeneratorfunction(inner):
        raise TypeError(f"handler for {job_type!r} is a generator function: a handler "
                        "returns its result (use async def, or def)")
    if not (inspect.isfunction(inner) or inspect.ismethod(inner)):
        raise TypeError(f"handler for {job_type!r} must be a function (async def, or a plain "
                        f"def that runs in a thread), not {type(func).__name__}")
    if inspect.iscoroutinefunction(inspect.unwrap(inner)):
        raise TypeError(f"handler for {job_type!r} is a plain function wrapping an async one "
                        "(a decorator that is not async-aware?): make the wrapper async def")
    return True


#: The registry `jobqueue worker` uses; `--import` loads modules that fill it.
handlers = HandlerRegistry()
