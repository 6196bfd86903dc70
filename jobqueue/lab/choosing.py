"""Lesson 04: choosing a lock. What PostgreSQL's advisory locks cost and do,
measured on the lesson's own database, beside what Redis, ZooKeeper and etcd
are documented to do.

Only the PostgreSQL side can be measured here (this machine runs no Redis,
ZooKeeper or etcd, and no network to partition), so the functions below
measure and demonstrate advisory locks, and `decision_matrix` says where each
of its cells comes from.

Every lock of the lesson is in class `LESSON` (two-integer form
`pg_try_advisory_lock(class, key)`), away from jobqueue's own classes.
"""

from __future__ import annotations

import asyncio
import functools
import json
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from jobqueue import db, lab
from jobqueue.testing import wait_for

#: The advisory lock class of lesson 04 (jobqueue owns 74171 and 74172).
LESSON = 4

# Locks by key: (LESSON, key).
LATENCY_KEY = 1
QUEUE_KEY = 2
HOLDER_KEY = 3

#: The floor of section 1: a round trip that asks the server for nothing.
FLOOR = "SELECT 1"


# --- latency -----------------------------------------------------------------


@dataclass
class RoundTrips:
    """Seconds per round trip, by kind, and what each lock call returned."""

    seconds: dict[str, list[float]] = field(default_factory=dict)
    returned: dict[str, list[Any]] = field(default_factory=dict)

    def add(self, kind: str, elapsed: float, value: Any) -> None:
        self.seconds.setdefault(kind, []).append(elapsed)
        self.returned.setdefault(kind, []).append(value)


async def _timed(conn: asyncpg.Connection, sql: str, *args: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    value = await conn.fetchval(sql, *args)
    return time.perf_counter() - started, value


async def measure_round_trips(
    conn: asyncpg.Connection, other: asyncpg.Connection, n: int = 1000
) -> RoundTrips:
    """Time `n` of each: the floor (`SELECT 1`), a free lock taken
    (`pg_try_advisory_lock`), released (`pg_advisory_unlock`), and a lock
    that `other` holds, tried in vain.

    One connection, one statement at a time, prepared once (asyncpg caches
    the statement): what is left is the round trip plus the server's work,
    which is what a lock call costs the caller. The kinds are interleaved so
    that a hiccup of the machine hits all of them alike.
    """
    floor, try_lock = FLOOR, "SELECT pg_try_advisory_lock($1, $2)"
    unlock = "SELECT pg_advisory_unlock($1, $2)"
    trips = RoundTrips()
    busy_key = LATENCY_KEY + 100
    await other.fetchval("SELECT pg_advisory_lock($1, $2)", LESSON, busy_key)
    try:
        for _ in range(n):
            trips.add(FLOOR, *await _timed(conn, floor))
            trips.add("try lock (free)", *await _timed(conn, try_lock, LESSON, LATENCY_KEY))
            trips.add("unlock", *await _timed(conn, unlock, LESSON, LATENCY_KEY))
            trips.add("try lock (held by another)",
                      *await _timed(conn, try_lock, LESSON, busy_key))
    finally:
        await other.fetchval("SELECT pg_advisory_unlock($1, $2)", LESSON, busy_key)
    return trips


def latency_table(trips: RoundTrips) -> Any:
    """Percentiles in microseconds, one row per kind of round trip."""
    import numpy as np
    import pandas as pd

    rows = []
    for kind, values in trips.seconds.items():
        us = np.array(values) * 1e6
        rows.append({"round trip": kind, "n": len(us),
                     "p50 µs": np.percentile(us, 50), "p95 µs": np.percentile(us, 95),
                     "p99 µs": np.percentile(us, 99), "max µs": us.max()})
    return pd.DataFrame(rows).set_index("round trip").round(1)


def median_ratios(trips: RoundTrips) -> dict[str, float]:
    """Each lock call's median round trip, as a multiple of the floor's
    (`SELECT 1`): 1.0 means the lock costs nothing beyond the round trip."""
    import numpy as np

    floor = float(np.median(trips.seconds[FLOOR]))
    return {kind: float(np.median(values)) / floor
            for kind, values in trips.seconds.items() if kind != FLOOR}


def medians_within(trips: RoundTrips, factor: float) -> bool:
    """Whether every lock call's median is within `factor` of the floor's.

    The lesson checks this on every run, loaded machine or not: the kinds are
    interleaved, so a slow moment of the machine slows all of them alike, and
    a median of many round trips does not move with a few slow ones."""
    return all(1 / factor <= r <= factor for r in median_ratios(trips).values())


def latency_summary(trips: RoundTrips) -> str:
    """What this run's figures say, in sentences computed from them (the
    figures change from run to run, so no sentence about them is typed)."""
    table = latency_table(trips)
    p50, p99 = table["p50 µs"], table["p99 µs"]
    locks = [kind for kind in table.index if kind != FLOOR]
    ratios = median_ratios(trips)
    n = int(table["n"].min())
    spread = p99.max() / p99.min()
    text = (f"At the median: `{FLOOR}` {p50[FLOOR]:.1f} µs, "
            f"the three lock calls {p50[locks].min():.1f}–{p50[locks].max():.1f} µs, "
            f"{min(ratios.values()):.2f}–{max(ratios.values()):.2f}× the floor. "
            f"{'In the tail they part' if spread >= 1.5 else 'In the tail they stay close'}: "
            f"p99 runs from {p99.min():.0f} µs ({p99.idxmin()}) to {p99.max():.0f} µs "
            f"({p99.idxmax()}), {spread:.1f}× apart. Each p99 is decided by the slowest 1% "
            f"of its {n:,} round trips, ")
    if p99[FLOOR] >= p99[locks].min():
        than = "every lock call" if p99[FLOOR] >= p99[locks].max() else "some of the lock calls"
        text += (f"and `{FLOOR}`, which takes no lock at all, has a longer tail than {than}: "
                 "there, the price is the machine's (scheduling, other processes), not the "
                 "lock's.")
    else:
        text += (f"and in this run every lock call's tail is longer than `{FLOOR}`'s: rerun "
                 "the cell to see whether that order holds from run to run.")
    return text


def cycles_per_second(trips: RoundTrips) -> float:
    """Lock-and-unlock cycles one connection can do per second, back to back,
    at the median round trip: the ceiling that round trips set."""
    import numpy as np

    cycle = (np.median(trips.seconds["try lock (free)"])
             + np.median(trips.seconds["unlock"]))
    return float(1 / cycle)


def plot_latencies(trips: RoundTrips) -> Any:
    """Each kind of round trip as a cumulative distribution: for every time on
    the x axis, the share of round trips that took at most that long. Where
    curves overlap the calls cost the same; the log scale keeps the tail, where
    they part, in view."""
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(8, 3.2))
    styles = ["-", "--", ":", "-."]
    for (kind, values), style in zip(trips.seconds.items(), styles, strict=False):
        us = np.sort(np.array(values) * 1e6)
        share = np.arange(1, len(us) + 1) / len(us)
        ax.step(us, share, where="post", linestyle=style, linewidth=1.6, label=kind)
    ax.set_xscale("log")
    ax.set_xlabel("round trip (µs, log scale)")
    ax.set_ylabel("share of round trips ≤ x")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.set_title(f"Round trips on one connection: {FLOOR} and advisory lock calls "
                 f"({min(len(v) for v in trips.seconds.values()):,} each)")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    plt.close(fig)
    return fig


# --- who holds what ----------------------------------------------------------


async def advisory_locks(conn: asyncpg.Connection) -> Any:
    """This database's advisory locks as pg_locks shows them, holders named by
    their connection's `application_name` ("lab A" shows as "A"), waiters in
    the order they started waiting."""
    rows = await conn.fetch(
        """SELECT replace(a.application_name, 'lab ', '') AS session,
                  l.classid AS class, l.objid AS key, l.mode, l.granted
           FROM pg_locks l JOIN pg_stat_activity a USING (pid)
           WHERE l.locktype = 'advisory'
             AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
           ORDER BY l.granted DESC, l.waitstart NULLS FIRST, session""")
    return lab.table(rows)


async def _waiting(conn: asyncpg.Connection, app_name: str, key: int) -> bool:
    return bool(await conn.fetchval(
        """SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
           WHERE a.application_name = $1 AND l.locktype = 'advisory'
             AND l.classid = $2 AND l.objid = $3 AND NOT l.granted
             AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())""",
        app_name, LESSON, key))


async def queue_up(
    holder: asyncpg.Connection, waiters: dict[str, asyncpg.Connection]
) -> dict[str, asyncio.Task[None]]:
    """`holder` takes lock (LESSON, QUEUE_KEY); then each waiter, in the
    dict's order, blocks in `pg_advisory_lock` on it. Each waiter starts only
    once the one before it is seen waiting in pg_locks, so the queue's order
    is known. Returns the waiters' pending calls by label."""
    await holder.fetchval("SELECT pg_advisory_lock($1, $2)", LESSON, QUEUE_KEY)
    tasks: dict[str, asyncio.Task[None]] = {}
    for label, conn in waiters.items():
        tasks[label] = asyncio.create_task(
            conn.execute("SELECT pg_advisory_lock($1, $2)", LESSON, QUEUE_KEY))
        await wait_for(functools.partial(_waiting, holder, f"lab {label}", QUEUE_KEY),
                       timeout=5, message=f"{label} waiting")
    return tasks


async def hand_over(
    holder: asyncpg.Connection, waiters: dict[str, asyncpg.Connection],
    tasks: dict[str, asyncio.Task[None]],
) -> list[str]:
    """Release the lock and let it pass down the queue: each session that gets
    it releases it in turn. Returns the labels in the order they got it."""
    order: list[str] = []
    pending = dict(tasks)
    releaser = holder
    while pending:
        await releaser.fetchval("SELECT pg_advisory_unlock($1, $2)", LESSON, QUEUE_KEY)
        done, _ = await asyncio.wait(pending.values(), timeout=5,
                                     return_when=asyncio.FIRST_COMPLETED)
        if not done:
            raise TimeoutError("no waiter got the released lock within 5 s")
        label = next(lbl for lbl, t in pending.items() if t in done)
        if len(done) > 1:
            raise AssertionError("two sessions got an exclusive lock at once")
        await pending.pop(label)
        order.append(label)
        releaser = waiters[label]
    await releaser.fetchval("SELECT pg_advisory_unlock($1, $2)", LESSON, QUEUE_KEY)
    return order


# --- a holder in another process ---------------------------------------------

# The child: takes the lock, writes a row in a transaction it never commits,
# prints its backend pid, then waits to be killed.
_HOLDER_SCRIPT = """
import asyncio, json, sys
import asyncpg

async def main():
    args = json.loads(sys.argv[1])
    conn = await asyncpg.connect(**args, server_settings={"application_name": sys.argv[2]})
    await conn.execute("SELECT pg_advisory_lock($1, $2)", int(sys.argv[3]), int(sys.argv[4]))
    await conn.execute("BEGIN")
    await conn.execute("INSERT INTO demo_users (id, balance) VALUES (99, 0)")
    print(await conn.fetchval("SELECT pg_backend_pid()"), flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


@dataclass
class LockHolder:
    """A child process holding lock (LESSON, HOLDER_KEY) on its own connection,
    with an uncommitted INSERT of user 99 open in a transaction."""

    proc: asyncio.subprocess.Process
    backend_pid: int

    def kill(self) -> None:
        """SIGKILL: no cleanup, no goodbye to the server."""
        self.proc.send_signal(signal.SIGKILL)

    def stop(self) -> None:
        """SIGSTOP: frozen, its connection still open."""
        self.proc.send_signal(signal.SIGSTOP)

    async def close(self) -> None:
        """Make sure the process is gone."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)  # works on a stopped process too
        await self.proc.wait()


async def start_lock_holder(url: str, label: str = "child") -> LockHolder:
    """Start a Python child process that takes the lock and stays; return once
    it holds the lock (it prints its backend's pid when it does)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _HOLDER_SCRIPT, json.dumps(db.asyncpg_connect_args(url)),
        f"lab {label}", str(LESSON), str(HOLDER_KEY),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), timeout=20)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    if not line:
        err = await proc.stderr.read() if proc.stderr else b""
        await proc.wait()
        raise RuntimeError(f"the lock holder died: {err.decode(errors='replace')}")
    return LockHolder(proc, int(line))


async def try_lock(conn: asyncpg.Connection, key: int = HOLDER_KEY) -> bool:
    """One `pg_try_advisory_lock` on the lesson's class: True if it is ours now."""
    return bool(await conn.fetchval("SELECT pg_try_advisory_lock($1, $2)", LESSON, key))


async def unlock(conn: asyncpg.Connection, key: int = HOLDER_KEY) -> bool:
    return bool(await conn.fetchval("SELECT pg_advisory_unlock($1, $2)", LESSON, key))


@dataclass
class Takeover:
    acquired: bool
    seconds: float
    attempts: int


async def wait_for_lock(
    conn: asyncpg.Connection, *, deadline: float = 5.0, key: int = HOLDER_KEY,
    interval: float = 0.001,
) -> Takeover:
    """Try the lock every `interval` seconds until it is ours or `deadline`
    passes: how long it took, timed from the call (call it right after the
    signal)."""
    started = time.perf_counter()
    attempts = 0
    while True:
        attempts += 1
        if await try_lock(conn, key):
            return Takeover(True, time.perf_counter() - started, attempts)
        if time.perf_counter() - started > deadline:
            return Takeover(False, time.perf_counter() - started, attempts)
        await asyncio.sleep(interval)


async def kill_and_take_over(
    holder: LockHolder, conn: asyncpg.Connection, *, deadline: float = 5.0
) -> Takeover:
    """SIGKILL the holder, then take its lock from `conn` as soon as possible."""
    holder.kill()
    takeover = await wait_for_lock(conn, deadline=deadline)
    await holder.proc.wait()
    return takeover


async def backend_alive(conn: asyncpg.Connection, pid: int) -> bool:
    """Whether a server process with this pid still serves a connection."""
    return bool(await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid))


async def terminate_backend(conn: asyncpg.Connection, pid: int) -> bool:
    """`pg_terminate_backend`: end another session from the server's side (what
    jobqueue's fencing does to a worker whose heartbeat stopped). Waits up to
    5 s for it to be gone."""
    return bool(await conn.fetchval("SELECT pg_terminate_backend($1, 5000)", pid))


# --- re-entrancy (the lesson's exercise) -------------------------------------


async def other_session_can_lock(
    a: asyncpg.Connection, b: asyncpg.Connection, *, locks: int, unlocks: int, key: int = 9
) -> bool:
    """Session `a` takes the same lock `locks` times and releases it `unlocks`
    times; then: does `b`'s try succeed? Everything is released afterwards."""
    for _ in range(locks):
        await a.fetchval("SELECT pg_advisory_lock($1, $2)", LESSON, key)
    for _ in range(unlocks):
        await a.fetchval("SELECT pg_advisory_unlock($1, $2)", LESSON, key)
    got = await try_lock(b, key)
    if got:
        await unlock(b, key)
    await a.execute("SELECT pg_advisory_unlock_all()")
    return got


# --- the decision matrix -----------------------------------------------------


MATRIX_COLUMNS = (
    "PostgreSQL advisory lock",
    "Redis (SET NX PX; Redlock)",
    "ZooKeeper / etcd",
    "evidence",
)

_MATRIX: tuple[tuple[str, str, str, str, str], ...] = (
    ("extra infrastructure",
     "none: the database you already run",
     "a Redis server (Redlock: 5 independent masters)",
     "a 3- or 5-node cluster (quorum)",
     "by construction"),
    ("acquisition latency",
     "one round trip to the database",
     "one round trip (Redlock: one to each master, in parallel)",
     "a quorum write (consensus) per acquisition",
     "PostgreSQL: measured in section 1 above; the others not measured here"),
    ("holder dies (crash)",
     "freed when its session ends: at once on a clean socket close",
     "held until the key's TTL (PX) expires",
     "held until the session (ZK) or lease (etcd) times out",
     "PostgreSQL: section 3 above; Redis SET docs, ZK recipes, etcd lease docs"),
    ("holder hangs (alive, stuck)",
     "held as long as its connection lives: add a heartbeat and "
     "pg_terminate_backend (jobqueue's fencing)",
     "TTL expires while it may still act: needs fencing",
     "session/lease expires while it may still act: needs fencing",
     "PostgreSQL: section 4 above; Kleppmann's critique"),
    ("fencing tokens",
     "none built in; writes on the lock's own connection die with it; "
     "else keep a counter (jobqueue checks worker_id)",
     "none (Redlock has no monotonic token)",
     "yes: zxid / znode version (ZK), key revision (etcd)",
     "PostgreSQL: section 3 above (the uncommitted insert died with the lock); "
     "Kleppmann's critique, ZK and etcd docs"),
    ("fairness / queueing",
     "blocked waiters are granted in arrival order",
     "no queue: clients retry (polling)",
     "FIFO by sequence number (ZK) / create revision (etcd)",
     "PostgreSQL: section 2 above; ZK lock recipe, etcd concurrency API"),
    ("cross-datacenter",
     "one primary: locks live in its memory, not WAL-logged, not replicated",
     "single instance, or Redlock over independent masters (its safety disputed)",
     "built for it: consensus across sites (writes pay the WAN round trip)",
     "docs (not testable here)"),
    ("throughput ceiling",
     "the database's: round trips and its shared lock table",
     "high (in-memory, single-threaded server)",
     "bounded by consensus writes",
     "PostgreSQL: section 1 above (one connection); others not measured here"),
    ("visibility",
     "SELECT … FROM pg_locks (holder, waiters, mode)",
     "GET the key; its TTL",
     "list the lock's children (ZK) / keys under the prefix (etcd)",
     "PostgreSQL: section 2 above (pg_locks)"),
)


def decision_matrix() -> Any:
    """The lesson's comparison as a table: one row per question, one column per
    kind of lock, and a column saying where the answer comes from (a cell of
    this notebook, or a named source: nothing here was measured for Redis,
    ZooKeeper or etcd)."""
    import pandas as pd

    frame = pd.DataFrame([row[1:] for row in _MATRIX], columns=list(MATRIX_COLUMNS),
                         index=[row[0] for row in _MATRIX])
    frame.index.name = "question"
    return frame
