"""Operators' reads that cannot weigh on the queue.

The API and the dashboard read the same table the workers claim from. A
client that asks for much, or many clients at once, must not take the
database's time from them: every read runs in a transaction of its own
under a statement timeout (`bounded`; a read past it is a 503 that says
so, never a query left running), and the readings every client asks for
alike (the counts by queue, type and status behind `/metrics` and
`/queues`) are made once for all of them within a second (`Shared`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

if TYPE_CHECKING:  # the API's extra; `jobqueue worker` imports this module without it
    from starlette.requests import Request
    from starlette.responses import Response

from jobqueue.schema.queries import queries

__all__ = ["READ_TIMEOUT", "TIMEOUT_HINT", "Shared", "bounded", "forget_after_change"]

Executor = AsyncConnection | AsyncSession
T = TypeVar("T")

#: Seconds an operator's read may run.
READ_TIMEOUT = 5.0
TIMEOUT_HINT = ("the read took longer than its statement timeout ({seconds:g} s) and was "
                "stopped; narrow it (a status, a type, a queue) or try again when the "
                "database is less busy")


@asynccontextmanager
async def bounded(conn: Executor, timeout: float = READ_TIMEOUT) -> AsyncIterator[None]:
    """A transaction whose statements stop after `timeout` seconds (SET
    LOCAL: a connection of the caller's own pool keeps its own setting)."""
    async with conn.begin():
        await conn.execute(queries["read_timeout"].text,
                           {"timeout": f"{max(1, round(timeout * 1000))}ms"})
        yield


class Shared(Generic[T]):
    """One reading for every caller within `ttl` seconds: callers that
    arrive while it is being read wait for it instead of reading again."""

    def __init__(self, read: Callable[[Executor], Awaitable[T]], ttl: float = 1.0) -> None:
        self.read, self.ttl = read, ttl
        self._lock = asyncio.Lock()
        self._value: T | None = None
        self._taken: float | None = None

    async def get(self, conn: Executor) -> T:
        async with self._lock:
            if self._taken is None or time.monotonic() - self._taken >= self.ttl:
                self._value = await self.read(conn)
                self._taken = time.monotonic()
            return self._value  # type: ignore[return-value]  # read above

    def forget(self) -> None:
        """The next caller reads afresh (after a change made through here)."""
        self._taken = None


class _Reading(Protocol):
    def forget(self) -> None: ...


def forget_after_change(request: Request, response: Response,
                        readings: tuple[_Reading, ...]) -> None:
    """After a change made through this process (a request that is not a
    read, and succeeded), its readings are read afresh: what the client
    looks at next shows the change, not the reading from before it."""
    from jobqueue.ops.origin import SAFE_METHODS  # starlette's: the API's extra, not the CLI's

    if request.method not in SAFE_METHODS and response.status_code < 400:
        for reading in readings:
            reading.forget()
