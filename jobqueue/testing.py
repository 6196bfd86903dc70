"""Helpers for testing code that uses jobqueue (and for jobqueue's own tests).

    from jobqueue.testing import drain, wait_for

    await enqueue(session, "send_email", {...}); await session.commit()
    report = await drain(db_url, registry=my_handlers)   # runs every due job, then returns
    await wait_for(lambda: job_is_done(job_id), timeout=5)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import asyncpg

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
    """Run every job that is due now, then return the worker's report.
    `options`: JobRunner's (a `config=`, or its settings); burst is implied."""
    options.setdefault("install_signal_handlers", False)
    config = options.pop("config", None)
    if config is not None:
        options["config"] = dataclasses.replace(config, burst=True)
    else:
        options["burst"] = True
    runner = JobRunner(database_url, registry=registry, **options)
    return await runner.run()


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
