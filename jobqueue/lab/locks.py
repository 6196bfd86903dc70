"""Advisory locks, seen from outside: the helpers of lessons 1–3.

The lessons run SQL such as `SELECT pg_try_advisory_lock($1)` in plain sight,
on connections named "A", "B", … (`lab.connect`). What they need besides is
a way to *look*: which connection holds which lock, who waits, and a record
of that over time. `pg_locks` knows, by backend pid; the helpers here put the
connection's label in place of the pid (pids change on every run, labels do
not, so a notebook's checked output stays the same).

They also hold two patterns worth keeping:

- `key_from_name`: a stable 64-bit lock key for a name (never Python's `hash()`);
- `advisory_lock`: a session-level advisory lock held on one dedicated
  SQLAlchemy connection for the whole life of the lock, never on a pooled
  connection that a commit hands back to the pool.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import asyncpg
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from jobqueue.schema.locks import ACTIVE_KEY, LEADER_KEY, LOCK_CLASS, WORKER_LOCK_CLASS

if TYPE_CHECKING:
    from jobqueue.worker import JobRunner

#: A lock key: one bigint, or two int4 (class, key).
Key = int | tuple[int, int]

_WORKER_APP = re.compile(r"^jobqueue worker (\d+) (\S+)")

# Advisory locks of the current database only: another database's locks with
# the same numbers are different locks (pg_locks.database tells them apart).
_ADVISORY_LOCKS = """
SELECT l.pid, a.application_name, l.locktype, l.classid::bigint AS classid,
       l.objid::bigint AS objid, l.objsubid, l.mode, l.granted
FROM pg_locks AS l
LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
WHERE l.locktype = 'advisory'
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


# -- names for connections ----------------------------------------------------


def connection_label(application_name: str | None,
                     workers: Mapping[int, str] | None = None) -> str:
    """A stable name for a connection, from its `application_name`.

    `lab <label>` (set by `lab.connect`) gives `<label>`; a jobqueue worker's
    connection (`jobqueue worker <id> <role> <host:pid>`) gives `<name> <role>`,
    where `workers` maps the random worker id to a name ("W1"), else "worker".
    """
    name = application_name or "?"
    if name.startswith("lab "):
        return name[4:]
    match = _WORKER_APP.match(name)
    if match:
        worker = (workers or {}).get(int(match.group(1)), "worker")
        return f"{worker} {match.group(2)}"
    return name


# -- keys -----------------------------------------------------------------------


def key_params(key: Key) -> tuple[int, ...]:
    """The arguments of a `pg_*advisory*` call for `key`."""
    return key if isinstance(key, tuple) else (key,)


def key_placeholders(key: Key, style: str = "$") -> str:
    """`$1` or `$1, $2` (asyncpg), `:k1` or `:k1, :k2` (SQLAlchemy `text`)."""
    n = len(key_params(key))
    if style == "$":
        return ", ".join(f"${i + 1}" for i in range(n))
    return ", ".join(f":k{i + 1}" for i in range(n))


def split_key(key: int) -> tuple[int, int, int]:
    """Where a one-bigint key shows up in pg_locks: (classid, objid, objsubid).

    The bigint's high 32 bits become `classid`, its low 32 bits `objid`, both
    read as unsigned; objsubid 1 marks the one-bigint form (2: two int4)."""
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
    return unsigned >> 32, unsigned & 0xFFFF_FFFF, 1


def key_from_name(name: str) -> int:
    """A stable bigint lock key for a name: the first 8 bytes of its SHA-256,
    as a signed 64-bit integer (the range of PostgreSQL's bigint).

    Stable across processes, machines, Python and PostgreSQL versions, unlike
    Python's `hash()` (salted per process for str) and PostgreSQL's internal
    `hashtext()` (32 bits, undocumented, free to change between versions).
    Two names collide with probability ~2**-64 per pair."""
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def python_hash_in_new_process(value: str) -> int:
    """`hash(value)` as a fresh Python process computes it.

    Runs with PYTHONHASHSEED unset, as processes normally do: each process
    picks a random salt for str hashes, so two processes (two workers, or the
    same worker after a restart) disagree. That is why `hash()` cannot name a
    lock that other processes must find."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    out = subprocess.run([sys.executable, "-c", f"print(hash({value!r}))"],
                         env=env, capture_output=True, text=True, check=True)
    return int(out.stdout)


async def first_hashtext_collision(conn: asyncpg.Connection, prefix: str,
                                   limit: int = 200_000) -> tuple[str, str, int] | None:
    """Among the names `<prefix>1 … <prefix><limit>`, the first pair with the
    same `hashtext()` (earliest second member): (first name, second name, hash).

    hashtext is 32 bits: by the birthday bound a collision is likely after
    some 77,000 names, so keys made from it clash in any large name space."""
    row = await conn.fetchrow(
        """
        WITH h AS (
            SELECT i, $1 || i AS name, hashtext($1 || i) AS k
            FROM generate_series(1, $2::int) AS i
        ), pairs AS (
            SELECT name, k, i,
                   first_value(name) OVER (PARTITION BY k ORDER BY i) AS earlier
            FROM h
        )
        SELECT earlier, name, k FROM pairs WHERE earlier <> name ORDER BY i LIMIT 1
        """,
        prefix, limit)
    return (row["earlier"], row["name"], row["k"]) if row else None


# -- looking at pg_locks --------------------------------------------------------


def _sort_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return (row["classid"], row["objid"], row["objsubid"], not row["granted"],
            row["connection"])


async def advisory_locks(observer: asyncpg.Connection, *,
                         workers: Mapping[int, str] | None = None) -> list[dict[str, Any]]:
    """The advisory locks of the current database, as `pg_locks` shows them,
    with the holding (or waiting) connection's label instead of its pid.

    Sorted by key, then granted before waiting, then label: the order is the
    same on every run."""
    rows = await observer.fetch(_ADVISORY_LOCKS)
    out = [
        {"connection": connection_label(r["application_name"], workers),
         "locktype": r["locktype"], "classid": r["classid"], "objid": r["objid"],
         "objsubid": r["objsubid"], "mode": r["mode"], "granted": r["granted"]}
        for r in rows
    ]
    return sorted(out, key=_sort_key)


def jobqueue_lock_name(classid: int, objid: int, objsubid: int,
                       workers: Mapping[int, str] | None = None) -> str:
    """What one of jobqueue's locks is for (see `jobqueue.schema.locks`); "" if not its."""
    if objsubid != 2:
        return ""
    if classid == LOCK_CLASS and objid == ACTIVE_KEY:
        return "active worker"
    if classid == LOCK_CLASS and objid == LEADER_KEY:
        return "maintenance leader"
    if classid == WORKER_LOCK_CLASS:
        return f"liveness of {(workers or {}).get(objid, 'a worker')}"
    return ""


async def jobqueue_locks(observer: asyncpg.Connection,
                         runners: Mapping[str, JobRunner] | None = None) -> list[dict[str, Any]]:
    """jobqueue's own advisory locks, named by purpose instead of numbers.

    `runners` names the workers ({"W1": runner, …}): a worker's id is random,
    new on every run (and every life), so rows show names, never ids."""
    workers = {r.worker_id: name for name, r in (runners or {}).items() if r.worker_id}
    rows = []
    for r in await advisory_locks(observer, workers=workers):
        name = jobqueue_lock_name(r["classid"], r["objid"], r["objsubid"], workers)
        if name:
            rows.append({"connection": r["connection"], "lock": name,
                         "classid": r["classid"], "mode": r["mode"],
                         "granted": r["granted"]})
    return sorted(rows, key=lambda r: (r["classid"], r["lock"], not r["granted"],
                                       r["connection"]))


async def wait_for_jobqueue_locks(observer: asyncpg.Connection,
                                  runners: Mapping[str, JobRunner], count: int,
                                  timeout: float = 10.0) -> list[dict[str, Any]]:
    """Wait until jobqueue's locks number `count`, then return them.

    A worker takes its locks over a few round trips (liveness, then the active
    lock, and the leader lock on its first upkeep tick): look once they all
    are there, not at a moment in between. Rows of workers not in `runners`
    (one that just stopped, whose server process is still exiting) must be
    gone too."""
    names = tuple(f"{name} " for name in runners)
    deadline = time.monotonic() + timeout
    while True:
        rows = await jobqueue_locks(observer, runners)
        if len(rows) == count and all(r["connection"].startswith(names) for r in rows):
            return rows
        if time.monotonic() >= deadline:
            raise TimeoutError(f"expected {count} jobqueue locks, found {len(rows)}")
        await asyncio.sleep(0.02)


def _matches(row: Mapping[str, Any], key: Key) -> bool:
    if isinstance(key, tuple):
        where = (key[0] & 0xFFFF_FFFF, key[1] & 0xFFFF_FFFF, 2)
    else:
        where = split_key(key)
    return (row["classid"], row["objid"], row["objsubid"]) == where


async def holders(observer: asyncpg.Connection, key: Key) -> list[str]:
    """Labels of the connections that hold `key` (granted), sorted."""
    return sorted(r["connection"] for r in await advisory_locks(observer)
                  if r["granted"] and _matches(r, key))


async def waiters(observer: asyncpg.Connection, key: Key) -> list[str]:
    """Labels of the connections waiting for `key`, sorted."""
    return sorted(r["connection"] for r in await advisory_locks(observer)
                  if not r["granted"] and _matches(r, key))


async def _pid_of(observer: asyncpg.Connection, label: str) -> int | None:
    return await observer.fetchval(
        "SELECT pid FROM pg_stat_activity WHERE application_name = $1 "
        "AND datname = current_database()", f"lab {label}")


async def wait_until_waiting(observer: asyncpg.Connection, label: str,
                             timeout: float = 5.0) -> str:
    """Wait until connection `label` is blocked on an advisory lock inside
    PostgreSQL; return its wait event ("advisory").

    A task that has *sent* `pg_advisory_lock` may not have reached the server
    yet; this looks at pg_stat_activity, where the wait is a fact."""
    deadline = time.monotonic() + timeout
    while True:
        row = await observer.fetchrow(
            "SELECT wait_event_type, wait_event FROM pg_stat_activity "
            "WHERE application_name = $1 AND datname = current_database()", f"lab {label}")
        if row and row["wait_event_type"] == "Lock" and row["wait_event"] == "advisory":
            return str(row["wait_event"])
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{label} is not waiting for an advisory lock")
        await asyncio.sleep(0.01)


async def blocked_by(observer: asyncpg.Connection, label: str) -> list[str]:
    """Labels of the connections that `label` waits for (`pg_blocking_pids`)."""
    pid = await _pid_of(observer, label)
    if pid is None:
        return []
    rows = await observer.fetch(
        "SELECT application_name FROM pg_stat_activity "
        "WHERE pid = ANY(pg_blocking_pids($1))", pid)
    return sorted(connection_label(r["application_name"]) for r in rows)


async def wait_until_free(observer: asyncpg.Connection, key: Key,
                          timeout: float = 5.0) -> bool:
    """Wait until nobody holds `key`; True. After a client drops its socket
    the server needs a moment to notice and end the backend, and only then
    are that backend's locks released."""
    deadline = time.monotonic() + timeout
    while await holders(observer, key):
        if time.monotonic() >= deadline:
            raise TimeoutError(f"lock {key} still held after {timeout:g}s")
        await asyncio.sleep(0.01)
    return True


# -- server messages ------------------------------------------------------------


@dataclass(eq=False)  # asyncpg keeps listeners in a set: hash by identity
class ServerLog:
    """Collects the notices and warnings PostgreSQL sends a connection.

        log = ServerLog(); conn.add_log_listener(log)

    asyncpg drops them unless a listener is added; `pg_advisory_unlock` on a
    lock the session does not hold answers false *and* sends a WARNING."""

    messages: list[str] = field(default_factory=list)

    def __call__(self, connection: object, message: asyncpg.PostgresLogMessage) -> None:
        self.messages.append(f"{message.severity}: {message.message}")


# -- a timeline of lock ownership -----------------------------------------------


@dataclass
class Timeline:
    """Who holds and who waits for one key, snapshotted after each event.

        timeline = Timeline(observer, key, ["A", "B", "C"])
        await a.fetchval("SELECT pg_advisory_lock($1)", key)
        await timeline.record("A locks")

    Each snapshot is read from pg_locks at the moment it is recorded; steps
    are numbered (not timed), so the record is the same on every run."""

    observer: asyncpg.Connection
    key: Key
    connections: Sequence[str]
    steps: list[dict[str, Any]] = field(default_factory=list)

    async def record(self, event: str) -> dict[str, Any]:
        step = {"step": len(self.steps), "event": event,
                "holder": ", ".join(await holders(self.observer, self.key)) or "-",
                "waiting": ", ".join(await waiters(self.observer, self.key)) or "-"}
        self.steps.append(step)
        return step

    def rows(self) -> list[dict[str, Any]]:
        return list(self.steps)

    def states(self, label: str) -> list[str]:
        """`label`'s state after each step: "holds", "waits" or ""."""
        return ["holds" if label in _split(s["holder"])
                else "waits" if label in _split(s["waiting"]) else ""
                for s in self.steps]

    def plot(self, title: str = "") -> Any:
        """A Gantt-like picture: one row per connection, a solid bar while it
        holds the lock, a hatched bar while it waits; one column per event,
        the state *after* that event."""
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch

        n = len(self.steps)
        fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * n), 0.8 + 0.55 * len(self.connections)))
        plt.close(fig)  # shown once, as the cell's value, not again by the inline backend
        style: dict[str, dict[str, Any]] = {
            "holds": {"color": "tab:green"},
            "waits": {"facecolor": "none", "edgecolor": "tab:orange", "hatch": "///"}}
        for row, label in enumerate(reversed(self.connections)):
            for state, start, length in _runs(self.states(label)):
                if state:
                    ax.broken_barh([(start, length)], (row - 0.35, 0.7), **style[state])
        ax.set_yticks(range(len(self.connections)), list(reversed(self.connections)))
        ax.set_xticks([i + 0.5 for i in range(n)],
                      [f"{s['step']}. {s['event']}" for s in self.steps],
                      rotation=35, ha="right", fontsize=8)
        ax.set_xticks(range(n + 1), minor=True)
        ax.tick_params(axis="x", length=0)
        ax.grid(axis="x", which="minor", color="0.85")
        ax.set_axisbelow(True)
        ax.set_xlim(0, n)
        ax.set_ylim(-0.6, len(self.connections) - 0.4)
        ax.legend(handles=[Patch(label="holds", **style["holds"]),
                           Patch(label="waits", **style["waits"])],
                  loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
        ax.set_title(title or f"who holds advisory lock {self.key}")
        fig.tight_layout()
        return fig


def _runs(states: Sequence[str]) -> list[tuple[str, int, int]]:
    """Consecutive equal states as (state, first index, length)."""
    runs: list[tuple[str, int, int]] = []
    for i, state in enumerate(states):
        if runs and runs[-1][0] == state:
            runs[-1] = (state, runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((state, i, 1))
    return runs


def _split(cell: str) -> Iterable[str]:
    return [] if cell == "-" else cell.split(", ")


# -- SQLAlchemy -----------------------------------------------------------------


def label_pool(engine: AsyncEngine, prefix: str = "pool") -> None:
    """Name each new pooled connection `lab <prefix> <n>` (n = 1, 2, … in the
    order the pool opens them), so pg_locks can say which one holds a lock."""
    count = 0

    @event.listens_for(engine.sync_engine, "connect")
    def _name(dbapi_connection: Any, _record: Any) -> None:
        nonlocal count
        count += 1
        name = f"lab {prefix} {count}"
        dbapi_connection.run_async(
            lambda conn: conn.execute(f"SET application_name = '{name}'"))


async def backend_pid(conn: AsyncConnection | Any) -> int:
    """`pg_backend_pid()` through a SQLAlchemy connection or session: which
    server process (which connection) a statement actually ran on."""
    return int((await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one())


async def connection_of(observer: asyncpg.Connection, conn: AsyncConnection | Any) -> str:
    """The label of the pooled connection a SQLAlchemy connection or session
    runs its statements on right now (see `label_pool`)."""
    name = await observer.fetchval(
        "SELECT application_name FROM pg_stat_activity WHERE pid = $1", await backend_pid(conn))
    return connection_label(name)


@asynccontextmanager
async def advisory_lock(engine: AsyncEngine, key: Key, *,
                        wait: bool = True) -> AsyncIterator[bool]:
    """A session-level advisory lock on a connection of its own.

        async with advisory_lock(engine, key) as acquired:        # waits
        async with advisory_lock(engine, key, wait=False) as acquired:  # tries

    The lock lives on one connection, checked out of `engine`'s pool for the
    whole block, so it is released on the connection that took it:

    - the implicit transaction is committed right after locking (a session
      lock survives commits), so the connection does not sit "idle in
      transaction" while the lock is held;
    - on exit it is unlocked on that same connection; if that fails, or does
      not answer true, or the block is cancelled while waiting, the connection
      is invalidated (closed, not pooled), which releases anything it held:
      a connection that might still hold a lock never goes back to the pool.

    Not re-entrant across blocks: a nested `advisory_lock` on the same key gets
    another connection, which waits for the outer one (or, with wait=False,
    gets False). If the connection drops while the block runs, the lock is
    gone without notice; jobqueue's worker watches its control connection for
    exactly that.
    """
    params = {f"k{i + 1}": v for i, v in enumerate(key_params(key))}
    args = key_placeholders(key, ":")
    conn = await engine.connect()
    try:
        try:
            if wait:
                await conn.execute(text(f"SELECT pg_advisory_lock({args})"), params)
                acquired = True
            else:
                result = await conn.execute(text(f"SELECT pg_try_advisory_lock({args})"), params)
                acquired = bool(result.scalar_one())
            await conn.commit()
        except BaseException:  # failed or cancelled while locking: held or not, drop it
            await conn.invalidate()
            raise
        try:
            yield acquired
        finally:
            if acquired and not await _unlock(conn, args, params):
                await conn.invalidate()
    finally:
        await conn.close()


async def _unlock(conn: AsyncConnection, args: str, params: dict[str, int]) -> bool:
    try:
        await conn.rollback()
        result = await conn.execute(text(f"SELECT pg_advisory_unlock({args})"), params)
        released = bool(result.scalar_one())
        await conn.commit()
        return released
    except Exception:
        return False
