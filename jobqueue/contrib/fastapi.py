"""A worker inside a FastAPI app's process, for small deployments.

    from jobqueue.contrib.fastapi import lifespan

    app = FastAPI(lifespan=lifespan(engine, concurrency=2))

The worker starts with the app and, when the app shuts down (uvicorn on
SIGTERM or Ctrl-C), stops the way `jobqueue worker` stops on SIGTERM:
running jobs get `grace_period` seconds to finish, and the jobs it had
claimed but not started go back to the queue. Uvicorn owns the signals,
so the worker installs none.

Why in the app at all: one process to deploy while the load is small. Each
app process runs a worker, and they share the queue the usual way: one
active and the others standing by (or all working, with `shared=True`).
Once jobs compete with requests for the event loop, run `jobqueue worker`
as a process of its own; the code does not change.

What the app sees: the worker is `app.state.jobqueue_worker` (its `role`,
`stats`). A worker that cannot reach the database keeps trying in the
background, as `jobqueue worker` does, while the app serves; a worker that
ends on an error is logged at ERROR with its traceback, and the app goes
on serving without one. A setting the worker refuses, or no handler
registered, is an error at startup: the app does not start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from jobqueue import db
from jobqueue.registry import HandlerRegistry, handlers
from jobqueue.worker import JobRunner

__all__ = ["lifespan", "running_worker"]

logger = logging.getLogger(__name__)

#: Seconds past the grace period to wait for the worker's own end before
#: giving up on it (its jobs are then rescued like a crashed worker's).
STOP_MARGIN = 10.0


@contextlib.asynccontextmanager
async def running_worker(database: str | AsyncEngine | None = None, *,
                         registry: HandlerRegistry = handlers,
                         **settings: Any) -> AsyncIterator[JobRunner]:
    """A worker running in this event loop for the `async with` block, then
    stopped gracefully. `database`: a URL, an engine (its URL: the worker
    opens connections of its own), or None for `DATABASE_URL`; `settings`:
    `WorkerConfig`'s (`concurrency`, `queues`, `shared`, ...)."""
    url = (database.url.render_as_string(hide_password=False)
           if isinstance(database, AsyncEngine) else db.database_url(database))
    if not len(registry):  # said at startup, not by a background task nobody awaits
        raise db.ConfigError("no handlers are registered, so the in-app worker could run no "
                             "job: import the modules that register them before the app starts")
    runner = JobRunner(url, registry=registry, install_signal_handlers=False, **settings)
    running = asyncio.create_task(runner.run(), name="jobqueue worker")
    running.add_done_callback(_report_end)
    try:
        yield runner
    finally:
        runner.stop()
        try:
            await asyncio.wait_for(asyncio.shield(running),
                                   runner.config.grace_period + STOP_MARGIN)
        except TimeoutError:
            logger.error("the in-app worker did not stop within %.0f s; leaving it",
                         runner.config.grace_period + STOP_MARGIN)
            running.cancel()
        except Exception:  # noqa: BLE001 - already logged by _report_end
            pass


def _report_end(running: asyncio.Task[dict[str, Any]]) -> None:
    if running.cancelled():
        return
    error = running.exception()
    if error is not None:
        logger.error("the in-app worker stopped on an error; the app goes on without one",
                     exc_info=error, extra={"event": "worker_failed"})


def lifespan(database: str | AsyncEngine | None = None, *,
             registry: HandlerRegistry = handlers,
             **settings: Any) -> Callable[[Any], AbstractAsyncContextManager[None]]:
    """A FastAPI (or Starlette) lifespan that runs `running_worker` for the
    app's life, with the worker at `app.state.jobqueue_worker`. To combine it
    with a lifespan of your own, use `running_worker` inside yours."""

    @contextlib.asynccontextmanager
    async def run(app: Any) -> AsyncIterator[None]:
        async with running_worker(database, registry=registry, **settings) as runner:
            app.state.jobqueue_worker = runner
            yield

    return run
