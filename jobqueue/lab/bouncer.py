"""A stand-in for PgBouncer in transaction pooling mode, for lesson 03.

PgBouncer is not installed here, and the lesson needs only one of its rules,
which this module reproduces with real server connections (asyncpg
connections to the lesson's database):

- **A client has a server connection for one transaction only.** PgBouncer
  with `pool_mode = transaction` assigns a server connection when a client's
  transaction starts (a statement outside `BEGIN … COMMIT` is a transaction
  of its own) and puts it back into the pool when the transaction ends.
- **It goes back as it is.** In transaction mode PgBouncer runs no reset
  query between transactions (`server_reset_query`, `DISCARD ALL`, is for
  session mode since PgBouncer 1.7, unless `server_reset_query_always` is
  set), so whatever the session holds stays on the server connection.
- **The next transaction takes the idle server connection used last** (LIFO,
  PgBouncer's default; `server_round_robin = 1` would rotate instead). A
  transaction that finds none idle waits for one.

Nothing else of PgBouncer is here: no wire protocol (clients call methods,
not a socket), no limits, timeouts or other settings. It is a model of the
assignment rule, labelled as such wherever a lesson uses it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import asyncpg


class TransactionPool:
    """Server connections handed out one transaction at a time.

        pool = TransactionPool({"server 1": s1, "server 2": s2})
        x = pool.client("X")
        await x.fetchval("SELECT pg_advisory_lock($1)", 7)   # a transaction of its own
        async with x.transaction():                           # one server for the block
            ...

    `log` records every statement: which client sent it, which server
    connection ran it, what it returned."""

    def __init__(self, servers: Mapping[str, asyncpg.Connection]) -> None:
        self._names = {id(conn): name for name, conn in servers.items()}
        # A stack: the end is the top, the server connection used last; the
        # first one given starts on top.
        self._idle: list[asyncpg.Connection] = list(reversed(list(servers.values())))
        self._released = asyncio.Condition()
        self.log: list[dict[str, Any]] = []
        #: Transactions waiting for a server connection right now.
        self.waiting = 0

    def client(self, name: str) -> PooledClient:
        """A client of the pool: what an application connected to PgBouncer holds."""
        return PooledClient(self, name)

    def server_name(self, server: asyncpg.Connection) -> str:
        return self._names[id(server)]

    @asynccontextmanager
    async def assign(self) -> AsyncIterator[asyncpg.Connection]:
        """A server connection for one transaction: the idle one used last,
        back on top of the stack when the transaction is over."""
        async with self._released:
            self.waiting += 1
            try:
                await self._released.wait_for(lambda: bool(self._idle))
            finally:
                self.waiting -= 1
            server = self._idle.pop()
        try:
            yield server
        finally:
            async with self._released:
                self._idle.append(server)
                self._released.notify()


class PooledClient:
    """One client connection to the pool. It looks like a connection; it has
    a server connection only while one of its transactions runs."""

    def __init__(self, pool: TransactionPool, name: str) -> None:
        self.pool = pool
        self.name = name
        self._server: asyncpg.Connection | None = None

    async def fetchval(self, sql: str, *args: Any) -> Any:
        """Run one statement: inside this client's open transaction if there
        is one, else as a transaction of its own on whichever server
        connection the pool assigns."""
        if self._server is not None:
            return await self._run(self._server, sql, args)
        async with self.pool.assign() as server:
            return await self._run(server, sql, args)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[PooledClient]:
        """`BEGIN … COMMIT` (ROLLBACK if the block raises) on one server
        connection, assigned at BEGIN and handed back after the end."""
        if self._server is not None:
            raise RuntimeError(f"client {self.name} is already in a transaction")
        async with self.pool.assign() as server:
            self._server = server
            try:
                async with server.transaction():
                    self._log(server, "BEGIN", None)
                    yield self
                self._log(server, "COMMIT", None)
            except BaseException:
                self._log(server, "ROLLBACK", None)
                raise
            finally:
                self._server = None

    async def _run(self, server: asyncpg.Connection, sql: str, args: tuple[Any, ...]) -> Any:
        value = await server.fetchval(sql, *args)
        self._log(server, sql, value)
        return value

    def _log(self, server: asyncpg.Connection, statement: str, value: Any) -> None:
        self.pool.log.append({"client": self.name, "server": self.pool.server_name(server),
                              "statement": statement,
                              "returned": "" if value is None else value})
