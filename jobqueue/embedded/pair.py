"""`EmbeddedPair`: a primary and a streaming standby with synchronous
replication, from the bundled PostgreSQL 16 binaries, for failover tests and
the recovery notebook.

Why here and not in `jobqueue.testing`: it is two `EmbeddedPostgres` with
other settings, run by the same rules (the server user as root, no folder
opened up, the binaries copied when out of its reach); `testing` is part of
the queue, which never imports `embedded`.

How it is set up, as one would by hand:

1. The primary: initdb (local socket ``trust``, TCP ``scram-sha-256`` with a
   random superuser password), listening on 127.0.0.1 on a free port.
2. The standby: ``pg_basebackup -R`` of the running primary over its unix
   socket (the base backup and the ``primary_conninfo`` it writes), started on
   a port of its own; it streams the primary's WAL from then on.
3. Synchronous replication: the primary's ``synchronous_standby_names`` names
   the standby (its ``cluster_name``, which the WAL receiver reports as its
   application name), set by ``ALTER SYSTEM`` once the standby streams (set
   earlier, the primary's own CREATE DATABASE would wait for a standby that
   does not exist yet). With ``synchronous_commit = on`` a COMMIT returns only
   once the standby has flushed its WAL: committed means replicated. The base
   backup was taken before that setting, so the standby, once promoted, does
   not wait for a standby of its own.

`url()` names both servers, `target_session_attrs=read-write`; `kill_primary()`
(SIGKILL of the postmaster, whose backends then exit) or `freeze_primary()`
(SIGSTOP of all its processes: a server that answers nothing while its TCP
connections stay open), then `promote()` (``pg_promote()``, timed). The old
primary is never brought back: after a failover it may hold a commit the
standby never received (one whose client was never told it committed), and
would have to be rebuilt from the new primary (a fresh base backup, or
pg_rewind).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import signal
import socket
import time
from pathlib import Path

from jobqueue import db
from jobqueue.embedded.paths import default_home, mkdirs
from jobqueue.embedded.process import EmbeddedPostgresError, child_pids, process_state
from jobqueue.embedded.server import DATABASE_NAME, SUPERUSER, EmbeddedPostgres

logger = logging.getLogger("jobqueue.embedded")

#: The nodes' names: folders under the pair's home, and `cluster_name`s.
NODES = ("a", "b")
#: Where pairs live under the embedded server's home, one folder each.
PAIRS = "pairs"
_READY_TIMEOUT = 60.0


def free_ports(count: int) -> list[int]:
    """Ports on 127.0.0.1 that nothing listens on right now (the kernel's
    choice; another process could take one before the server binds it)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def cluster_name(node: str) -> str:
    return f"jobqueue_{node}"


class EmbeddedPair:
    """Two PostgreSQL 16 servers under ``home`` (by default a fresh folder in
    ``<embedded home>/pairs/``): ``primary`` and ``standby``, which trade
    places when the standby is promoted. For one failover: the killed primary
    is not brought back. ``stop()`` ends both and removes their folders."""

    def __init__(self, home: Path | None = None) -> None:
        base = default_home() / PAIRS
        if home is None:
            sweep(base)
            home = base / f"{os.getpid()}-{secrets.token_hex(4)}"
        self.home = Path(home).resolve()
        self._password = secrets.token_urlsafe(18)
        self.nodes = [
            EmbeddedPostgres(self.home / name, port=port, password=self._password,
                             settings={"listen_addresses": "127.0.0.1",
                                       "cluster_name": cluster_name(name)})
            for name, port in zip(NODES, free_ports(len(NODES)), strict=True)]
        self.primary: EmbeddedPostgres = self.nodes[0]
        self.standby: EmbeddedPostgres | None = self.nodes[1]

    def __repr__(self) -> str:
        return f"EmbeddedPair(home={str(self.home)!r}, ports={[n.port for n in self.nodes]})"

    def url(self, database: str = DATABASE_NAME) -> str:
        """SQLAlchemy URL naming both servers over TCP, in their first order
        (the URL a worker keeps across the failover), read-write only."""
        hosts = "&".join(f"host=127.0.0.1:{node.port}" for node in self.nodes)
        return (f"postgresql+asyncpg://{SUPERUSER}:{self._password}@/{database}?{hosts}"
                "&target_session_attrs=read-write")

    def start(self) -> str:
        """Primary, base backup, standby, synchronous replication; the URL."""
        mkdirs(self.home, 0o755 if os.geteuid() == 0 else None)
        started = time.monotonic()
        self.primary.start()
        self._follow(self.nodes[1])
        logger.info("started a primary and a synchronous standby on ports %d and %d (%.2fs)",
                    self.nodes[0].port, self.nodes[1].port, time.monotonic() - started)
        return self.url()

    def rebuild(self) -> None:
        """After a failover (or the standby's end), make the lost node a
        synchronous standby of the primary: whatever is left of it ended, its
        data replaced by a fresh base backup (an old primary may hold a commit
        the new one never got). The pair can then fail over again."""
        if self.standby is not None:
            raise EmbeddedPostgresError("the pair has a standby: nothing to rebuild")
        lost = next(node for node in self.nodes if node is not self.primary)
        started = time.monotonic()
        _end(lost)
        shutil.rmtree(lost.data_dir)
        # The killed postmaster's socket lock names a dead (or zombie) pid.
        for leftover in lost.socket_dir.glob(f".s.PGSQL.{lost.port}*"):
            leftover.unlink(missing_ok=True)
        self._follow(lost)
        logger.info("rebuilt %s as the standby (%.2fs)", lost.data_dir, time.monotonic() - started)

    def _follow(self, node: EmbeddedPostgres) -> None:
        """`node`, empty, becomes the primary's synchronous standby."""
        node.init_standby(self.primary)
        node.start()
        name = cluster_name(node.home.name)
        self.primary.psql(f"ALTER SYSTEM SET synchronous_standby_names = '{name}'")
        self.primary.psql("SELECT pg_reload_conf()")
        deadline = time.monotonic() + _READY_TIMEOUT
        query = f"SELECT sync_state FROM pg_stat_replication WHERE application_name = '{name}'"
        while self.primary.psql(query, database="postgres") != "sync":
            if time.monotonic() > deadline:
                raise EmbeddedPostgresError(f"{name} did not become a synchronous standby")
            time.sleep(0.05)
        self.standby = node

    def replication(self) -> str:
        """How the primary sees its standby: its ``sync_state`` ("sync"), or
        "" when none streams."""
        return self.primary.psql("SELECT string_agg(sync_state, ',') FROM pg_stat_replication",
                                 database="postgres")

    # -- failures ---------------------------------------------------------------------

    def kill_primary(self) -> None:
        """SIGKILL of the primary's postmaster, as a crash or the OOM killer
        would: its backends notice and exit, closing their connections."""
        pid = self._primary_pid()
        os.kill(pid, signal.SIGKILL)
        logger.info("killed the primary's postmaster (pid %d)", pid)

    def kill_standby(self) -> None:
        """SIGKILL of the standby's postmaster: the primary's commits then wait
        for a synchronous standby that is not there, until `rebuild()`."""
        if self.standby is None:
            raise EmbeddedPostgresError("no standby to kill")
        pid = self.standby.postmaster_pid()
        if pid is None:
            raise EmbeddedPostgresError("the standby is not running")
        os.kill(pid, signal.SIGKILL)
        self.standby = None
        logger.info("killed the standby's postmaster (pid %d)", pid)

    def freeze_primary(self) -> None:
        """SIGSTOP of every process of the primary: like a server cut off or
        hung, it answers nothing, and its TCP connections stay open (the kernel
        still acknowledges), so only a client's own timeout notices."""
        pid = self._primary_pid()
        for process in [pid, *child_pids(pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process, signal.SIGSTOP)
        logger.info("froze the primary (postmaster pid %d and its children)", pid)

    async def promote(self, timeout: float = _READY_TIMEOUT) -> float:
        """Promote the standby (``pg_promote``); the seconds from asking to
        the moment it takes writes (``pg_is_in_recovery()`` false, polled
        every 5 ms). It is then the primary, and there is no standby."""
        if self.standby is None:
            raise EmbeddedPostgresError("no standby to promote: this pair has failed over")
        node = self.standby
        conn = await db.connect(node.url(database="postgres"), application_name="jobqueue pair")
        try:
            started = time.monotonic()
            await conn.fetchval("SELECT pg_promote(wait => false)")
            while await conn.fetchval("SELECT pg_is_in_recovery()"):
                if time.monotonic() - started > timeout:
                    raise EmbeddedPostgresError(f"the standby was not promoted in {timeout:g}s")
                await asyncio.sleep(0.005)
            took = time.monotonic() - started
        finally:
            await conn.close()
        self.primary, self.standby = node, None
        logger.info("promoted the standby on port %d (%.3fs)", node.port, took)
        return took

    def _primary_pid(self) -> int:
        pid = self.primary.postmaster_pid()
        if pid is None:
            raise EmbeddedPostgresError("the primary is not running")
        return pid

    # -- the end ----------------------------------------------------------------------

    def stop(self) -> None:
        """End both servers (a frozen or killed one by SIGKILL of whatever is
        left of it) and remove their folders."""
        for node in self.nodes:
            _end(node)
        _remove(self.home, self.nodes)


async def migrated_pair(*statements: str) -> EmbeddedPair:
    """A started pair with jobqueue's schema (the migrations, on the primary,
    replicated like everything else) and `statements` run after it (the
    tables a test's handlers write); `stop()` it when done."""
    from jobqueue.schema import migrations

    pair = EmbeddedPair()
    try:
        url = await asyncio.to_thread(pair.start)
        await migrations.upgrade(url)
        conn = await db.connect(url)
        try:
            for statement in statements:
                await conn.execute(statement)
        finally:
            await conn.close()
    except BaseException:
        await asyncio.to_thread(pair.stop)
        raise
    return pair


def _end(node: EmbeddedPostgres) -> None:
    """Stop a node: fast shutdown when it is running and awake, else SIGKILL
    of its postmaster and every child still there."""
    pid = node.postmaster_pid()
    if pid is not None and process_state(pid) not in ("T", "t"):
        with contextlib.suppress(EmbeddedPostgresError):
            node.stop()
            return
    for process in ([pid, *child_pids(pid)] if pid is not None else []):
        with contextlib.suppress(ProcessLookupError):
            os.kill(process, signal.SIGKILL)


def _remove(home: Path, nodes: list[EmbeddedPostgres]) -> None:
    """The pair's folders: its home, and wherever a node's data or socket went
    instead (as root, when the home is out of the server user's reach)."""
    for node in nodes:
        for folder in (node.data_dir.parent, node.socket_dir):
            if not folder.is_relative_to(home):
                shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(home, ignore_errors=True)


def sweep(base: Path) -> None:
    """End and remove pairs whose creating process is gone (a test run
    killed before it could stop them): their postmasters would run on."""
    if not base.is_dir():
        return
    for home in base.iterdir():
        owner = home.name.split("-", 1)[0]
        if not owner.isdigit() or _alive(int(owner)):
            continue
        nodes = [EmbeddedPostgres(home / name) for name in NODES]
        logger.info("removing the pair %s, left by process %s", home, owner)
        for node in nodes:
            pid = node.postmaster_pid()
            for process in ([pid, *child_pids(pid)] if pid is not None else []):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process, signal.SIGKILL)
        _remove(home, nodes)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return process_state(pid) not in (None, "Z", "X")

