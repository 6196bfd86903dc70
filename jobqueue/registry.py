"""Handlers by job type.

A handler is `async def handler(session, payload) -> result`. The session is an
`AsyncSession` whose work runs inside a savepoint of the worker's batch
transaction: what the handler writes commits together with the job's
completion, or rolls back alone if the handler fails.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from jobqueue.enqueue import check_job_type

logger = logging.getLogger(__name__)

JobHandler = Callable[[AsyncSession, dict[str, Any]], Awaitable[Any]]


class HandlerRegistry:
    """Which coroutine runs which job type."""

    def __init__(self) -> None:
        self._handlers: dict[str, JobHandler] = {}

    def register(self, job_type: str) -> Callable[[JobHandler], JobHandler]:
        """Decorator: `@handlers.register("send_email")`."""
        check_job_type(job_type)

        def decorator(func: JobHandler) -> JobHandler:
            self.add(job_type, func)
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
