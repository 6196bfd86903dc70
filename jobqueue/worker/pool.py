"""The threads sync handlers run in: at most `size` at once, daemons, for the
runner's whole life (`threads.py` runs each job in one).

**A thread cannot be killed.** `ThreadPool.interrupt(job_id, reason)` makes
the handler's next statement raise `Interrupted` and cancels a statement
already running (psycopg's `cancel_safe`), and the attempt fails with
`reason` whatever the handler does next; but Python code that never calls
the database again (a `time.sleep`, a socket read without a timeout) runs
on until it returns by itself. A sync handler that never returns holds its
thread, and its place in the pool, for the rest of the process: the pool
has one thread fewer, its job stays `processing` until the worker stops or
is cut off (then it goes back to the queue like any abandoned job), and the
threads are daemons, so a stopping worker exits without waiting for it.
Give blocking calls their own timeouts.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import os
import queue
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jobqueue.worker.handler import ClaimedJob


class Interrupted(Exception):
    """A running sync job was interrupted (`ThreadPool.interrupt`)."""


@dataclass
class SyncRun:
    """One sync job in its thread, and what the event loop may tell it.
    Plain attributes, each written by one side and read by the other."""

    job: ClaimedJob
    #: Set by `interrupt`: the attempt fails with this, whatever the handler does.
    reason: str | None = None
    #: Set when the job is abandoned: record nothing, whatever happens next.
    cut: bool = False
    #: The psycopg connection while the job has one (to cancel or cut it).
    driver: Any = None
    #: The handler is running: its statements may be interrupted.
    in_handler: bool = False
    #: A statement of the handler is on its way or running (`_before_statement`).
    in_statement: bool = False
    #: Held while a statement cancel is sent, and by the thread as the handler
    #: ends: no cancel meant for the handler reaches the outcome's statements.
    guard: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    #: Its transaction is open: the handler sent a statement (`_before_statement`).
    began: bool = False
    #: A statement of the handler failed and no savepoint of its own undid it.
    db_error: bool = False
    #: Why the handler's attempt to end its transaction was refused (`guard.py`).
    refused: str | None = None
    #: Where the batch's traces come from, when the worker traces (`tracing.py`).
    traces: Any = None


class ThreadPool:
    """At most `size` daemon threads running sync jobs, for the runner's
    whole life (a thread that outlives a life of the worker still counts:
    the bound is on threads, not on claims). Used from the event loop only;
    the threads answer through `call_soon_threadsafe`."""

    def __init__(self, size: int) -> None:
        self.size = size
        #: Running jobs by id (across lives, until their thread returns).
        self.running: dict[uuid.UUID, SyncRun] = {}
        #: Threads busy with a job. More than `running` holds when a stuck
        #: thread's job was given back and runs again here meanwhile.
        self.busy = 0
        self._work: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._freed: asyncio.Event | None = None

    @property
    def free(self) -> int:
        return self.size - self.busy

    async def wait_free(self, stop: asyncio.Event) -> None:
        """Until a thread is free, or `stop` is set."""
        while not self.free and not stop.is_set():
            freed = self._freed = self._freed or asyncio.Event()
            freed.clear()
            waits = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(freed.wait())}
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in waits:
                    waiting.cancel()

    def submit(self, run: SyncRun, fn: Callable[[SyncRun], Any]) -> asyncio.Future[Any]:
        """Run `fn(run)` in a thread, in a copy of the caller's context (so
        context variables, `current_job()` among them, reach the handler);
        the future resolves when it returns. Never more than `size` at once:
        the caller checks `free` first."""
        if not self.free:
            raise RuntimeError("no free thread")  # the caller's bug, never the user's
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        self.running[run.job.id] = run
        self.busy += 1
        if len(self._threads) < self.busy:
            thread = threading.Thread(target=self._serve, daemon=True,
                                      name=f"jobqueue-sync-{len(self._threads) + 1}")
            self._threads.append(thread)
            thread.start()
        self._work.put((contextvars.copy_context(), fn, run, loop, done))
        return done

    def _serve(self) -> None:
        """A thread's life: run what comes, until told to stop (None)."""
        while (item := self._work.get()) is not None:
            context, fn, run, loop, done = item
            result: Any = None
            error: BaseException | None = None
            try:
                result = context.run(fn, run)
            except BaseException as exc:  # handed to the loop, which decides
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(self._finished, run, done, result, error)

    def _finished(self, run: SyncRun, done: asyncio.Future[Any], result: Any,
                  error: BaseException | None) -> None:
        self.busy -= 1
        if self.running.get(run.job.id) is run:
            del self.running[run.job.id]
        if self._freed is not None:
            self._freed.set()
        if done.cancelled():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)

    async def interrupt(self, job_id: uuid.UUID, reason: str) -> bool:
        """Stop a running sync job as soon as it lets us: its next statement
        raises `Interrupted`, a statement it is running is cancelled, and its
        attempt fails with `reason` (retried like any failure) even if the
        handler carries on. False: no such job runs here. Python code that
        never touches the database again cannot be stopped (module doc)."""
        run = self.running.get(job_id)
        if run is None:
            return False
        run.reason = reason  # before looking at in_statement: see _before_statement
        # A cancel that reaches the server before the statement it was meant
        # for is dropped there (an idle backend ignores it), and the statement
        # then runs its course: so it is sent again until the statement ends.
        # (A cancel request is a connection of its own: off the event loop.)
        while self.running.get(job_id) is run and await asyncio.to_thread(_cancel_statement, run):
            await asyncio.sleep(_CANCEL_AGAIN_S)
        return True

    def close(self) -> None:
        """Let the idle threads end (a busy one ends when its job returns)."""
        for _ in self._threads:
            self._work.put(None)
        self._threads = []


#: How soon a statement cancel is sent again while the statement still runs.
_CANCEL_AGAIN_S = 0.05


def _cancel_statement(run: SyncRun) -> bool:
    """In a thread: cancel the handler's statement that runs now, if one does
    (True: one did, and may still)."""
    with run.guard:
        driver = run.driver
        if not (run.in_handler and run.in_statement) or driver is None:
            return False
        with contextlib.suppress(Exception):
            driver.cancel_safe()
        return True


def sever(run: SyncRun) -> None:
    """Abandon a running job: record nothing of it, and shut its connection's
    socket down under whatever it is doing, so the server rolls its
    transaction back. (Closing a psycopg connection that another thread is
    using is not safe; shutting the socket down is, and the thread's next
    read or write fails.) A backend busy in a long statement notices only
    when that ends: the runner also terminates it (`terminate_lanes`)."""
    run.cut = True
    driver = run.driver
    if driver is None:
        return
    with contextlib.suppress(Exception):
        with socket.socket(fileno=os.dup(driver.pgconn.socket)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
