"""Helpers for testing code that uses jobqueue (and for jobqueue's own tests).

    from jobqueue.testing import drain, sql_trace, wait_for

    await enqueue(session, "send_email", {...}); await session.commit()
    report = await drain(db_url, registry=my_handlers)   # runs every due job, then returns
    await wait_for(lambda: job_is_done(job_id), timeout=5)
    with sql_trace() as trace:                           # every statement a worker sends
        await drain(db_url, registry=my_handlers)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import asyncpg
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from jobqueue import db
from jobqueue.registry import HandlerRegistry, handlers
from jobqueue.schema.locks import ACTIVE_KEY, LOCK_CLASS
from jobqueue.schema.queries import queries
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
    """Run every job that is due now, then return the worker's report.
    `options`: JobRunner's (a `config=`, or its settings); burst is implied.

    RuntimeError at once, saying which worker, when another worker is active
    on the database (a development worker left running): an exclusive drain
    would stand by until that worker stops, and that one would run the jobs.
    `shared=True` drains beside it instead."""
    options.setdefault("install_signal_handlers", False)
    config = options.pop("config", None)
    if config is not None:
        options["config"] = dataclasses.replace(config, burst=True)
    else:
        options["burst"] = True
    runner = JobRunner(database_url, registry=registry, **options)
    if not runner.config.shared:
        holder = await _active_holder(db.database_url(runner.database_url))
        if holder is not None:
            raise RuntimeError(
                f"drain() cannot run: {holder!r} is the active worker on this database; "
                "a drain would stand by until it stops, and it would run the jobs. "
                "Stop it, or call drain(..., shared=True) to run beside it")
    return await runner.run()


async def _active_holder(url: str) -> str | None:
    """Who holds the database's active-worker lock (`queries.sql: active_holder`)."""
    conn = await db.connect(url, application_name="jobqueue drain")
    try:
        return await queries["active_holder"].fetchval(conn, lock_class=LOCK_CLASS,
                                                       key=ACTIVE_KEY)
    finally:
        await conn.close()


class WorkerProcess:
    """A real `jobqueue worker` process: for tests and benchmarks that are
    about processes (signals, crashes, takeover). Output goes to `log_path`.

    `command` replaces `-m jobqueue worker` (the benchmark lab runs its peers'
    workers the same way) and `env` adds to the environment."""

    def __init__(self, database_url: str, log_path: Path, *args: str,
                 cwd: Path | None = None,
                 command: Sequence[str] = ("-m", "jobqueue", "worker"),
                 env: Mapping[str, str] | None = None) -> None:
        self.log_path = log_path
        environ = {**os.environ, "DATABASE_URL": database_url, "PYTHONUNBUFFERED": "1",
                   **(env or {})}
        self._log: IO[str] = open(log_path, "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, *command, *args],
            cwd=cwd, env=environ, stdout=self._log, stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text()

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    async def wait(self, timeout: float = 30.0) -> int:
        """The exit code, once the process has ended."""
        return await asyncio.to_thread(self.proc.wait, timeout)

    async def finish(self, timeout: float) -> None:
        """Wait for a process that ends by itself (burst, drain); RuntimeError
        with the tail of its log unless it exits 0."""
        code = await self.wait(timeout)
        if code != 0:
            raise RuntimeError(f"worker exited with {code}: {self.log()[-2000:]}")

    async def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM, a graceful exit within `timeout`, then `close()` whatever happened."""
        self.signal(signal.SIGTERM)
        with contextlib.suppress(Exception):
            await self.wait(timeout)
        self.close()

    def close(self) -> None:
        """Make sure the process is gone (SIGCONT first, in case it was stopped)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


async def worker_state(conn: asyncpg.Connection, worker: WorkerProcess) -> asyncpg.Record | None:
    """A worker process's live registration (id and state; the id changes with
    each life), or None while it has none."""
    return await conn.fetchrow(
        "SELECT id, state FROM jobqueue_workers WHERE name LIKE '%:' || $1::integer",
        worker.pid)


async def in_state(conn: asyncpg.Connection, worker: WorkerProcess, state: str) -> bool:
    row = await worker_state(conn, worker)
    return row is not None and row["state"] == state


# -- what a connection sends ----------------------------------------------------


def shorten(sql: str, width: int = 72) -> str:
    """A statement on one line, cut to `width` characters."""
    one = " ".join(sql.split())
    return one if len(one) <= width else one[: width - 1] + "…"


def _shape(sql: str) -> str:
    """A statement with its parameters blanked, to compare SQL texts."""
    sql = re.sub(r"\$\d+|(?<![:\w]):\w+", "?", sql)
    return " ".join(sql.split())


#: How asyncpg's own type introspection queries begin.
_DRIVER_INTROSPECTION = ("SELECT current_setting('jit')", "WITH RECURSIVE typeinfo_tree",
                         "SELECT set_config('jit'")

_NAMED = {_shape(q.sql): name for name, q in queries.items()}


def _label(statement: str) -> str:
    statement = statement.strip().rstrip(";")
    name = _NAMED.get(_shape(statement))
    return f"{name}  (jobqueue/schema/queries.sql)" if name else shorten(statement, 80)


class _Trace:
    """The hooks of `sql_trace`, writing into one list."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.drivers: list[Any] = []

    @staticmethod
    def autocommit(conn: Any) -> bool:
        return bool(getattr(conn.connection.dbapi_connection, "autocommit", False))

    def add(self, conn: Any, line: str) -> None:
        # asyncpg calls its query loggers through the event loop (call_soon):
        # on a connection it logs, SQLAlchemy's lines take the same queue, so
        # the trace keeps the order in which the statements were sent.
        if self.autocommit(conn):
            asyncio.get_running_loop().call_soon(self.lines.append, line)
        else:
            self.lines.append(line)

    def logged(self, record: Any) -> None:
        if not " ".join(record.query.split()).startswith(_DRIVER_INTROSPECTION):
            self.lines.append(_label(record.query))

    def connected(self, conn: Any) -> None:
        driver = conn.connection.driver_connection
        if self.autocommit(conn) and driver is not None and driver not in self.drivers:
            driver.add_query_logger(self.logged)
            self.drivers.append(driver)

    def statement(self, conn: Any, cursor: Any, sql: str, *args: Any) -> None:
        self.add(conn, _label(sql))

    def failed(self, context: Any) -> None:
        if context.connection is not None and context.statement:
            self.add(context.connection, _label(context.statement))

    def transaction(self, word: str) -> Callable[[Any], None]:
        def hook(conn: Any) -> None:
            if not self.autocommit(conn):  # then SQLAlchemy's BEGIN/COMMIT send nothing
                self.lines.append(word)
        return hook

    def hooks(self) -> dict[str, Callable[..., None]]:
        # A statement is written down once it has run (or failed), as asyncpg
        # logs its own: what a hook sends just before a statement (jobqueue's
        # savepoints) comes first in the trace, as it did on the wire.
        return {"engine_connect": self.connected, "after_cursor_execute": self.statement,
                "handle_error": self.failed,
                "begin": self.transaction("BEGIN"), "commit": self.transaction("COMMIT"),
                "rollback": self.transaction("ROLLBACK")}


@contextmanager
def sql_trace(engine: AsyncEngine | None = None) -> Iterator[list[str]]:
    """Record what a connection sends: each statement (shortened; jobqueue's
    own queries by their name in queries.sql) and BEGIN / COMMIT / ROLLBACK
    of the transactions around them. On `engine`, or on every engine made
    while recording (jobqueue's worker makes its own).

    SQLAlchemy's events see what goes through it (sessions, savepoints). A
    worker's lane runs its batch transactions and its own statements on the
    driver directly, with SQLAlchemy in autocommit mode: on such connections
    asyncpg's query logger records those too (leaving out the queries asyncpg
    sends on its own to learn a type the first time it meets it).

        with sql_trace(engine) as trace:
            ...
        print("\\n".join(trace))
    """
    target: Any = engine.sync_engine if engine is not None else Engine
    trace = _Trace()
    hooks = trace.hooks()
    for name, fn in hooks.items():
        event.listen(target, name, fn)
    try:
        yield trace.lines
    finally:
        for name, fn in hooks.items():
            event.remove(target, name, fn)
        for driver in trace.drivers:
            driver.remove_query_logger(trace.logged)
