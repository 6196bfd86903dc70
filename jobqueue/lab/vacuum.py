"""Lesson 08: a transaction that holds back vacuum, and what it costs the claim.

Every job a quick batch finishes leaves one dead row version behind in `jobs`
(its waiting version) and an entry in `idx_jobs_pickable` that points to it.
Vacuum removes both once no transaction could still see the old version.
While one transaction holds back the xmin horizon it can remove neither, and
the claim's index scan, which starts at the front of the index, steps over
every one of them.

- `Flow` runs jobs through the queue as a worker's quick batch does, with the
  queue's own statements (`take`, then `complete`, one transaction a batch);
- `claim_cost` measures one claim with `EXPLAIN (ANALYZE, BUFFERS)`, rolled back;
- `vacuum` runs `VACUUM (VERBOSE)` and reads back what it says it did;
- the same `take` from the front (no floor: what a worker's first claim in a
  queue reads) and from the floor the previous claim returned (what every
  claim after it reads, `jobqueue/worker/floors.py`).
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

import asyncpg

from jobqueue.schema.queries import queries
from jobqueue.worker.floors import NIL

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

#: The lesson's jobs: nothing runs them but the lesson's own batches.
JOB_TYPE = "noop"
QUEUE = "default"

#: A floor as a lane keeps it: (run_at, id; NIL for the time alone).
Floor = tuple[datetime, uuid.UUID]

#: The claim a quick batch sends (queries.sql): one arm per job type and
#: priority, each read from a floor (NULL: from the front of idx_jobs_pickable).
TAKE = queries["take"]


@dataclass
class Flow:
    """Jobs passing through the queue on one connection, as one worker's
    quick batches take and complete them. The jobs `add` makes are due one
    millisecond apart, an hour ago and on, so they are taken in the order
    they were added."""

    conn: asyncpg.Connection
    start: datetime
    #: Most jobs one batch takes (the worker's default `batch_size`).
    batch: int = 1000
    added: int = 0
    completed: int = 0
    #: Where the next floored batch starts, as the last one said: (run_at, id)
    #: (None: the front).
    floor: Floor | None = None

    @classmethod
    async def open(cls, conn: asyncpg.Connection, *, batch: int = 1000) -> Flow:
        """A flow whose jobs are due from an hour ago on (the database's
        clock): due at once, and before any job enqueued from now on."""
        return cls(conn, await conn.fetchval("SELECT now() - interval '1 hour'"), batch=batch)

    async def add(self, n: int) -> None:
        """n due jobs, in one plain INSERT (every other column has a default).
        They are due before a floor at the time of the last claim: the flow
        lowers its floor to the first of them, as a worker does when the
        insert announces them (section 5)."""
        if n <= 0:
            return
        first = await self.conn.fetchval(
            "WITH new AS (INSERT INTO jobs (job_type, run_at) "
            "SELECT $1, CAST($2 AS timestamptz) + k * interval '1 ms' "
            "FROM generate_series(CAST($3 AS int), CAST($4 AS int)) AS k RETURNING run_at) "
            "SELECT min(run_at) FROM new",
            JOB_TYPE, self.start, self.added, self.added + n - 1)
        if self.floor is not None and self.floor > (first, NIL):
            self.floor = (first, NIL)
        self.added += n

    async def run(self, *, floored: bool = False) -> int:
        """Take and complete every waiting job, one batch transaction at a
        time (`take`, then `complete`; a real batch also records itself and
        runs the handlers in between); how many. `floored`: each take from
        the floor the one before returned, as a lane does; else from the front."""
        done = 0
        while True:
            async with self.conn.transaction():
                rows = await TAKE.fetch(self.conn, **self._claim(
                    self.floor if floored else None))
                if rows[0]["id"] is None:  # no job: only where the next take starts
                    break
                ids = [row["id"] for row in rows]
                await queries["complete"].fetch(self.conn, ids=ids, results=["null"] * len(ids),
                                                worker_id=None, taken=True)
            if floored:
                self.floor = (rows[-1]["floor"], rows[-1]["floor_id"] or NIL)
            done += len(ids)
            self.completed += len(ids)
        return done

    async def complete_until(self, completed: int, *, floored: bool = False) -> None:
        """Add jobs (if need be) and run every waiting one, until `completed`
        jobs are done in all; then send this connection's counts to the
        statistics (`dead_tuples`), so that n_dead_tup counts them at once."""
        await self.add(max(completed - self.added, 0))
        await self.run(floored=floored)
        await self.conn.execute("SELECT pg_stat_force_next_flush()")

    def _claim(self, floor: Floor | None) -> dict[str, Any]:
        return claim_values(floor, self.batch)


def claim_values(floor: Floor | None, limit: int
                 ) -> dict[str, Any]:
    """`take`'s parameters for the lesson's one queue and priority, from
    `floor` (None: from the front)."""
    at, job_id = floor or (None, None)
    return {"queue": QUEUE, "arm_types": [JOB_TYPE], "limit": limit, "priorities": [0],
            "floors": [at], "floor_ids": [job_id]}


async def dead_tuples(conn: asyncpg.Connection, table: str = "jobs") -> int:
    """`n_dead_tup` of `table`, with this connection's own counts in it: a
    backend sends its counts to the statistics at most once a second, after
    a statement; `pg_stat_force_next_flush()` makes the next time now."""
    await conn.execute("SELECT pg_stat_force_next_flush()")
    return int(await conn.fetchval(
        "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = CAST($1 AS regclass)", table))


class Cost(NamedTuple):
    """One claim, as EXPLAIN (ANALYZE, BUFFERS) saw it."""

    buffers: int  # shared buffers the whole claim touched (found in memory or read)
    scan_buffers: int  # of those, its index scan's: index pages, and heap pages it visited
    ms: float  # its execution time
    taken: int  # jobs it locked
    plan: str  # the plan's path down, with the index it read


async def claim_cost(conn: asyncpg.Connection, *, floor: Floor | None = None,
                     floored: bool = False, limit: int = 1000) -> Cost:
    """One claim under EXPLAIN (ANALYZE, BUFFERS), in a transaction rolled
    back afterwards: its jobs stay waiting. `floored`: `take` from `floor`;
    else from the front."""
    plan = json.loads(await explain(conn, floor=floor, floored=floored, limit=limit,
                                    json_format=True))[0]
    top = plan["Plan"]
    node = taken = next(c for c in top.get("Plans", [])
                        if c.get("Subplan Name") == "CTE taken")
    path = ["CTE taken"]
    while True:  # down to the scan of the claim index, the way the rows come up
        path.append(node["Node Type"] + (f" ({node['Index Name']})" if "Index Name" in node
                                         else ""))
        below = [c for c in node.get("Plans", []) if _reads_pickable(c)
                 and c.get("Parent Relationship") in ("Outer", "Inner", "Subquery")]
        if not below:
            break
        node = below[0]
    return Cost(_buffers(top), _buffers(node), round(plan["Execution Time"], 2),
                taken["Actual Rows"], " > ".join(path))


#: The indexes a claim may read: by type, or across types where every
#: waiting job is of the claim's type (as here), which the planner may
#: find cheaper.
CLAIM_INDEXES = ("idx_jobs_pickable", "idx_jobs_waiting")


def _reads_pickable(node: dict[str, Any]) -> bool:
    return node.get("Index Name") in CLAIM_INDEXES or any(
        _reads_pickable(c) for c in node.get("Plans", [])
        if c.get("Parent Relationship") != "InitPlan")


def _buffers(node: dict[str, Any]) -> int:
    return int(node["Shared Hit Blocks"] + node["Shared Read Blocks"])


async def explain(conn: asyncpg.Connection, *, floor: Floor | None = None,
                  floored: bool = False, limit: int = 1000, json_format: bool = False) -> str:
    """The claim's `EXPLAIN (ANALYZE, BUFFERS)`, rolled back (`claim_cost`)."""
    values = claim_values(floor if floored else None, limit)
    query = TAKE
    options = "ANALYZE, BUFFERS" + (", FORMAT JSON" if json_format else "")
    tx = conn.transaction()
    await tx.start()
    try:
        rows = await conn.fetch(f"EXPLAIN ({options}) {query.positional}", *query.args(values))
    finally:
        await tx.rollback()
    return "\n".join(row[0] for row in rows)


async def pile_up(flow: Flow, steps: list[int], *, waiting: int,
                  floored: bool = False) -> pd.DataFrame:
    """At each step: run the flow until `step` more jobs than at the start are
    completed, add `waiting` due jobs, and measure the claim that would take
    them, from the front (and, `floored`, from the flow's floor, the flow
    itself then claiming from its floor too). One row a step; the waiting
    jobs of the last step are completed too before it returns."""
    import pandas as pd

    base, rows = flow.completed, []
    for step in steps:
        await flow.complete_until(base + step, floored=floored)
        await flow.add(waiting)
        front = await claim_cost(flow.conn, limit=flow.batch)
        row: dict[str, Any] = {"dead versions": await dead_tuples(flow.conn),
                               "buffers": front.buffers, "scan buffers": front.scan_buffers,
                               "ms": front.ms, "taken": front.taken}
        if floored:
            low = await claim_cost(flow.conn, floored=True, floor=flow.floor, limit=flow.batch)
            row |= {"floored buffers": low.buffers, "floored scan buffers": low.scan_buffers,
                    "floored ms": low.ms, "floored taken": low.taken}
        rows.append(row)
    await flow.complete_until(flow.added, floored=floored)
    return pd.DataFrame(rows)


async def enqueue(conn: asyncpg.Connection) -> Any:
    """One lesson job, through the queue's own `enqueue` statement: due at
    now(), which is the start of the transaction it is in; its id."""
    return await queries["enqueue"].fetchval(
        conn, job_type=JOB_TYPE, payload="{}", max_retries=0, run_at=None, queue=QUEUE,
        priority=0, unique_key=None, timeout=None, trace_context=None)


class Vacuumed(NamedTuple):
    """What `VACUUM (VERBOSE)` said it did to `jobs`."""

    removed: int  # dead row versions it removed
    not_removable: int  # dead row versions it had to leave: some snapshot may still need them
    dead_items: int  # dead line pointers it removed, with the index entries pointing to them
    cutoff: int  # its removable cutoff: versions deleted by this xid or later must stay
    index_pages_deleted: int  # pages of idx_jobs_pickable it emptied and deleted


_TUPLES = re.compile(r"tuples: (\d+) removed, \d+ remain, (\d+) are dead but not yet removable")
_ITEMS = re.compile(r"(\d+) dead item identifiers")
_CUTOFF = re.compile(r"removable cutoff: (\d+)")
_INDEX = re.compile(r'index "idx_jobs_pickable": pages: \d+ in total, (\d+) newly deleted')


async def vacuum(conn: asyncpg.Connection) -> Vacuumed:
    """`VACUUM (VERBOSE) jobs`, read back from the report it sends as an
    INFO message (caught by a log listener)."""
    said: list[str] = []

    def listen(_: Any, message: asyncpg.PostgresLogMessage) -> None:
        said.append(message.message)

    conn.add_log_listener(listen)
    try:
        await conn.execute("VACUUM (VERBOSE) jobs")
        await asyncio.sleep(0)  # let the listener's callbacks run
    finally:
        conn.remove_log_listener(listen)
    report = next((m for m in said if m.startswith("finished vacuuming")
                   and '.public.jobs"' in m), None)
    if report is None:
        raise RuntimeError(f"VACUUM VERBOSE sent no report on jobs: {said!r}")
    removed, not_removable = _numbers(_TUPLES, report)
    (dead_items,), (cutoff,) = _numbers(_ITEMS, report), _numbers(_CUTOFF, report)
    index = _INDEX.search(report)  # absent when vacuum skipped the indexes: nothing to remove
    return Vacuumed(removed, not_removable, dead_items, cutoff,
                    int(index.group(1)) if index else 0)


def _numbers(pattern: re.Pattern[str], report: str) -> list[int]:
    match = pattern.search(report)
    if match is None:
        raise RuntimeError(f"VACUUM VERBOSE's report has no {pattern.pattern!r}: {report!r}")
    return [int(n) for n in match.groups()]


async def status_vacuum_line(conn: asyncpg.Connection) -> str:
    """The `vacuum` line of `jobqueue status`, as it prints it."""
    from jobqueue.ops.cli import format_summary
    from jobqueue.ops.status import queue_summary

    lines = format_summary(await queue_summary(conn)).splitlines()
    return next(line.strip() for line in lines if line.strip().startswith("vacuum "))


def plot_buffers(front: pd.DataFrame, floored: pd.DataFrame | None = None) -> Figure:
    """Buffers one claim reads against the dead versions before it: from the
    front (`pile_up`'s table), and from a floor (a floored one's)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.plot(front["dead versions"], front["buffers"], "o-", label="take, from the front")
    if floored is not None:
        ax.plot(floored["dead versions"], floored["buffers"], "o--", color="0.55",
                label="take, from the front (held again)")
        ax.plot(floored["dead versions"], floored["floored buffers"], "s-", color="tab:green",
                label="take, from a floor")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.0f}"))
    ax.set_xlabel("dead row versions in jobs (n_dead_tup)")
    ax.set_ylabel("shared buffers one claim reads")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("The claim under a held xmin horizon")
    fig.tight_layout()
    plt.close(fig)
    return fig
