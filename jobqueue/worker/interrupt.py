"""Stopping one running handler (its timeout, a cancel) and nothing else.

A lane runs its handlers inline, in the lane's own task, one after another
inside one batch transaction. To stop a handler, the lane's task is cancelled
while it waits inside that handler, and `_run_one` catches the CancelledError
where it called the handler: its savepoint rolls back, its batch-mates keep
theirs. Where the cancellation lands matters:

- **At the handler's own await** (an HTTP call, a sleep): cancelled at once.
- **Inside SQLAlchemy** (a statement of the handler, its session's rollback):
  never. SQLAlchemy takes a BaseException arriving there as a lost
  connection and invalidates the connection, and the whole batch would go
  with it. Instead, a statement in progress is cancelled on the server
  (`pg_cancel_backend`, sent from another connection), so it ends with an
  error the handler sees; every later statement of the handler fails at
  once, before it is sent (a hook in `handler.py`); and the task is
  cancelled at the handler's first await outside SQLAlchemy, looked for
  every millisecond.
- **A handler that never awaits** (it blocks the event loop: `time.sleep`, a
  CPU loop) cannot be stopped from the loop it blocks. Nothing else in the
  worker runs either, its heartbeat included: past the lease another worker
  fences this one (its connections are terminated, so the handler's writes
  roll back) and rescues its jobs. When the handler returns at last, it is
  failed all the same (its time ran out, or it was cancelled). Plain `def`
  handlers run in threads for this reason.

A handler that catches the CancelledError and returns anyway is failed
just the same: the stop was asked for, and the lane records it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.util import greenlet_spawn

from jobqueue.worker.handler import IN_HANDLER, LaneState

#: How often a stop waiting for the handler to leave SQLAlchemy looks again.
_RETRY_S = 0.001


def timed_out(seconds: float) -> str:
    """The error of an attempt that ran out of time."""
    return f"TimeoutError: the handler ran longer than its timeout of {seconds:g} s"


def _in_sqlalchemy(task: asyncio.Task[Any]) -> bool:
    """Is `task` suspended inside SQLAlchemy's bridge to the driver? (Its
    chain of awaits passes through `greenlet_spawn`.)"""
    awaited: Any = task.get_coro()
    while awaited is not None:
        if getattr(awaited, "cr_code", None) is greenlet_spawn.__code__:
            return True
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    return False


class Stopper:
    """A lane's means to stop the handler it is running.

    `cancel_statement(pid)`: cancel whatever the backend `pid` is running,
    from another connection (the worker's monitor connection)."""

    def __init__(self, state: LaneState, session_info: dict[Any, Any],
                 cancel_statement: Callable[[int], Awaitable[Any]]) -> None:
        self.state = state  # the lane connection's: its statement hooks read `interrupt`
        self.session_info = session_info
        self.cancel_statement = cancel_statement
        self.task: asyncio.Task[Any] | None = None
        self.pid = 0  # the lane's backend
        self.job_id: uuid.UUID | None = None
        self.reason: str | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._deadline: tuple[float, float] | None = None  # (loop time, timeout)
        self._retry: asyncio.TimerHandle | None = None
        self._statement_cancel: asyncio.Task[Any] | None = None

    def start(self, job_id: uuid.UUID, timeout: float | None) -> None:
        """A handler starts: stoppable from now on, and stopped after
        `timeout` seconds if it is still running."""
        self.job_id = job_id
        if timeout is not None:
            loop = asyncio.get_running_loop()
            self._deadline = (loop.time() + timeout, timeout)
            self._timer = loop.call_later(timeout, self.stop, job_id, timed_out(timeout))

    def finish(self) -> str | None:
        """The handler is over: why it was stopped (None: it was not). Costs
        next to nothing for a handler that nobody stopped and that had no
        timeout: the lane calls it for every job. Then, if `cancelling`,
        await `settled()` before the lane's next statement."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._deadline is not None:
            # A handler that blocked the loop past its time returns before
            # its timer could run: it has timed out all the same.
            deadline, timeout = self._deadline
            if self.reason is None and asyncio.get_running_loop().time() >= deadline:
                self.reason = timed_out(timeout)
            self._deadline = None
        self.job_id = None
        reason = self.reason
        if reason is not None:
            if self._retry is not None:
                self._retry.cancel()
                self._retry = None
            self.reason = None
            self.state.interrupt = None
        return reason

    @property
    def cancelling(self) -> bool:
        """A statement cancel is still on its way to the server."""
        return self._statement_cancel is not None

    async def settled(self) -> None:
        """Wait for the statement cancel to have been sent, so that it cannot
        reach a statement of the lane's own."""
        if self._statement_cancel is not None:
            await asyncio.gather(self._statement_cancel, return_exceptions=True)
            self._statement_cancel = None

    def stop(self, job_id: uuid.UUID, reason: str) -> bool:
        """Stop the handler running `job_id`, if this lane runs it; True if so.
        A second request for the same run changes nothing."""
        if job_id != self.job_id:
            return False
        if self.reason is None:
            self.reason = reason
            self.state.interrupt = reason
            self._deliver()
        return True

    def _deliver(self) -> None:
        """Cancel the task now if it waits inside the handler outside
        SQLAlchemy; else cancel the statement on the server and look again."""
        self._retry = None
        task = self.task
        if task is None or self.reason is None or not self.session_info.get(IN_HANDLER):
            return  # over already: `finish` reports the reason
        if not _in_sqlalchemy(task):
            task.cancel()
            return
        if self.state.in_statement and self._statement_cancel is None:
            self._statement_cancel = asyncio.ensure_future(self.cancel_statement(self.pid))
        self._retry = asyncio.get_running_loop().call_later(_RETRY_S, self._deliver)
