"""Helpers for testing code that uses jobqueue (and for jobqueue's own tests).

    from jobqueue.testing import drain, wait_for

    await enqueue(session, "send_email", {...}); await session.commit()
    report = await drain(db_url, registry=my_handlers)   # runs every due job, then returns
    await wait_for(lambda: job_is_done(job_id), timeout=5)
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

from jobqueue.registry import HandlerRegistry, handlers
from jobqueue.worker import JobRunner


async def wait_for(
    condition: Callable[[], Awaitable[Any] | Any],
    *,
    timeout: float = 10.0,
    interval: float = 0.02,
    message: str = "condition",
) -> Any:
    """Poll `condition` until it returns something truthy; return that.

    Raises TimeoutError after `timeout` seconds, naming what was awaited:
    tests wait for a state, never for a fixed time.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{message} not reached within {timeout:g}s")
        await asyncio.sleep(interval)


async def drain(
    database_url: str | None = None, *, registry: HandlerRegistry = handlers, **options: Any
) -> dict[str, Any]:
    """Run every job that is due now, then return the worker's report."""
    options.setdefault("install_signal_handlers", False)
    runner = JobRunner(database_url, registry=registry, burst=True, **options)
    return await runner.run()
