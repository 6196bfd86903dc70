"""Lesson 07's section 9: queues, priorities, limits and schedules, read back
from what the database recorded.

Which queue a job waits in and its priority decide who runs it and when; a
queue's limit or pause holds for every worker at once; a schedule's ticks
become jobs, one per tick. Each helper reads the answer off the jobs' own
columns (the order of `completed_at`, the overlap of `started_at` and
`completed_at`, the rows of `jobqueue_schedules`), so what the lesson prints
is a fact of the run, and the same in every run.

The lesson drives the scheduler with times it chooses (`utc`), on one day
(`CLOCK_DAY`); the tables show those times of day, which the notebooks'
sanitizer leaves alone, so the ticks stay checked.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any

import asyncpg
from sqlalchemy.ext.asyncio import AsyncSession

from jobqueue.schema.queries import queries

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

#: The day the lesson tells its scheduler it is (a clock injected, never read).
CLOCK_DAY = date(2026, 12, 1)


def utc(time_of_day: str) -> datetime:
    """`"10:00:30"` (or `"10:00:59.9"`): that moment of `CLOCK_DAY`, in UTC,
    for `Scheduler.run_once(conn, now=...)`."""
    return datetime.combine(CLOCK_DAY, datetime.strptime(
        time_of_day, "%H:%M:%S.%f" if "." in time_of_day else "%H:%M:%S").time(), UTC)


def time_of_day(at: datetime | None) -> str:
    """A time of `CLOCK_DAY` as `HH:MM:SS` (UTC); any other day in full ISO
    8601, which the sanitizer turns into TIMESTAMP, so a tick on the wrong
    day fails the checked cell instead of hiding in it."""
    if at is None:
        return ""
    at = at.astimezone(UTC)
    return at.strftime("%H:%M:%S") if at.date() == CLOCK_DAY else at.isoformat()


async def tick(session: AsyncSession, payload: dict[str, Any]) -> dict[str, Any]:
    """The lesson's recurring job: it only says which tick it ran for (its
    payload, `{"tick": "<ISO 8601>"}`, written by the scheduler)."""
    return {"ran_for": payload["tick"]}


# -- queues and priorities -------------------------------------------------------------


async def run_order(conn: asyncpg.Connection, jobs: Mapping[str, uuid.UUID]) -> pd.DataFrame:
    """The jobs under their labels, as enqueued, with where each came in the
    order of completion (`ran`: 1 for the first `completed_at` among them;
    equal times share a rank; empty: not run)."""
    import pandas as pd

    rows = {r["id"]: r for r in await conn.fetch(
        "SELECT id, job_type, queue, priority, status, "
        "CASE WHEN completed_at IS NOT NULL "
        "     THEN rank() OVER (PARTITION BY completed_at IS NULL ORDER BY completed_at) END "
        "     AS ran "
        "FROM jobqueue_all_jobs WHERE id = ANY($1)", list(jobs.values()))}
    table = []
    for label, job_id in jobs.items():
        r = rows[job_id]
        table.append({"job": label, "job_type": r["job_type"], "queue": r["queue"],
                      "priority": r["priority"], "status": r["status"],
                      "ran": "" if r["ran"] is None else int(r["ran"])})
    return pd.DataFrame(table)


def ran_in_order(table: pd.DataFrame) -> list[str]:
    """The labels of the jobs of a `run_order` table that ran, first to last."""
    done = table[table["ran"] != ""]
    return [str(label) for label in done.sort_values("ran", kind="stable")["job"]]


def by_priority(table: pd.DataFrame, queue: str) -> list[str]:
    """The labels of `queue`'s jobs of a `run_order` table in the order the
    claim statement promises: highest priority first, then the earliest due
    (the table lists them as enqueued, each in a transaction of its own, so
    each was due a moment after the one before)."""
    mine = table[table["queue"] == queue]
    return [str(label) for label in mine.sort_values("priority", ascending=False,
                                                     kind="stable")["job"]]


# -- limits -----------------------------------------------------------------------------

#: The most jobs of $1 (ids) running at one instant, from their own
#: timestamps: +1 at each `started_at`, -1 at each `completed_at`, summed in
#: time order (an end before a start at the same instant: a job that ended as
#: another began never ran beside it).
MOST_AT_ONCE = """
WITH ran AS (
    SELECT started_at, completed_at FROM jobqueue_all_jobs
    WHERE id = ANY($1) AND started_at IS NOT NULL AND completed_at IS NOT NULL
), edges AS (
    SELECT started_at AS at, 1 AS delta FROM ran
    UNION ALL
    SELECT completed_at, -1 FROM ran
)
SELECT coalesce(max(running), 0) FROM (
    SELECT sum(delta) OVER (ORDER BY at, delta) AS running FROM edges) AS s
"""


async def most_at_once(conn: asyncpg.Connection, ids: Sequence[uuid.UUID]) -> int:
    """The most of `ids` that ran at the same time (finished jobs only),
    from the database's own timestamps, not from any worker's account."""
    return int(await conn.fetchval(MOST_AT_ONCE, list(ids)))


async def spans(conn: asyncpg.Connection, ids: Sequence[uuid.UUID]) -> pd.DataFrame:
    """When each finished job of `ids` ran: `start` and `end` in seconds from
    the first start among them, in the order they started."""
    import pandas as pd

    rows = await conn.fetch(
        "SELECT extract(epoch FROM started_at - min(started_at) OVER ()) AS start, "
        "extract(epoch FROM completed_at - min(started_at) OVER ()) AS end "
        "FROM jobqueue_all_jobs "
        "WHERE id = ANY($1) AND started_at IS NOT NULL AND completed_at IS NOT NULL "
        "ORDER BY started_at, completed_at", list(ids))
    return pd.DataFrame([{"start": float(r["start"]), "end": float(r["end"])} for r in rows],
                        columns=["start", "end"])


def running_at_once(table: pd.DataFrame, step: float = 0.02) -> tuple[Any, Any]:
    """The most jobs of a `spans` table running within each `step` seconds:
    (start of each step, most running in it). The most, not a sample: a job
    that ends a moment before the next one starts does not dip the line."""
    import numpy as np

    edges = sorted([(t, 1) for t in table["start"]] + [(t, -1) for t in table["end"]])
    times = np.array([t for t, _ in edges])
    running = np.cumsum([d for _, d in edges])
    grid = np.arange(0.0, float(table["end"].max()) + step, step)
    most = []
    for low in grid:
        before = running[times < low]
        inside = running[(times >= low) & (times < low + step)]
        carried = int(before[-1]) if len(before) else 0
        most.append(max([carried, *inside.tolist()]))
    return grid, np.array(most)


def plot_spans(runs: Mapping[str, pd.DataFrame]) -> Figure:
    """One panel per run: each job a bar from its start to its end, and the
    most running at once through the run, on one scale for every panel, so
    the ceiling a limit sets shows beside the run without one."""
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, len(runs), figsize=(4.8 * len(runs), 3.6), sharex=True,
                             sharey=True, squeeze=False)
    counts = {title: running_at_once(table) for title, table in runs.items()}
    top = max(int(most.max()) for _, most in counts.values())
    for ax, (title, table) in zip(axes[0], runs.items(), strict=True):
        ax.barh(np.arange(len(table)), table["end"] - table["start"], left=table["start"],
                height=0.7, color="tab:blue", alpha=0.5)
        ax.set_title(title)
        ax.set_xlabel("seconds since the first start (database clock)")
        grid, most = counts[title]
        twin = ax.twinx()
        twin.step(grid, most, where="post", color="tab:red")
        twin.axhline(most.max(), color="tab:red", linestyle="--", linewidth=0.8)
        twin.annotate(f"at most {int(most.max())} at once", (1, most.max()),
                      xycoords=("axes fraction", "data"), xytext=(-4, 4),
                      textcoords="offset points", ha="right", color="tab:red")
        twin.set_ylim(0, top + 0.8)
        twin.set_ylabel("running", color="tab:red")
    axes[0][0].set_ylabel("job, in the order started")
    axes[0][0].invert_yaxis()  # shared: once for every panel
    fig.tight_layout()
    return fig


async def queue_settings(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    """The rows of `jobqueue_queues`: the queues someone paused or limited
    (the statement every worker reads them with)."""
    rows = await queries["queue_settings"].fetch(conn)
    return [dict(r) for r in sorted(rows, key=lambda r: r["name"])]


# -- schedules --------------------------------------------------------------------------


async def schedule_rows(conn: asyncpg.Connection) -> pd.DataFrame:
    """`jobqueue_schedules`: each recurring type, its schedule, and the last
    tick enqueued for it (a time of `CLOCK_DAY`)."""
    import pandas as pd

    rows = await conn.fetch(
        "SELECT job_type, schedule, last_tick FROM jobqueue_schedules ORDER BY job_type")
    return pd.DataFrame([{"job_type": r["job_type"], "schedule": r["schedule"],
                          "last_tick": time_of_day(r["last_tick"])} for r in rows],
                        columns=["job_type", "schedule", "last_tick"])


async def scheduled_jobs(conn: asyncpg.Connection, job_type: str) -> pd.DataFrame:
    """The jobs a schedule made, by tick: the tick (a time of `CLOCK_DAY`)
    from the payload, the queue and priority the registration gave, their
    status, and the unique key that refuses a second job for a tick."""
    import pandas as pd

    rows = await conn.fetch(
        "SELECT CAST(payload ->> 'tick' AS timestamptz) AS tick, payload::text AS payload, "
        "queue, priority, status, unique_key FROM jobqueue_all_jobs WHERE job_type = $1 "
        "ORDER BY tick", job_type)
    return pd.DataFrame([{"tick": time_of_day(r["tick"]), "payload": r["payload"],
                          "queue": r["queue"], "priority": r["priority"],
                          "status": r["status"], "unique_key": r["unique_key"]} for r in rows],
                        columns=["tick", "payload", "queue", "priority", "status",
                                 "unique_key"])


async def tick_outcome(conn: asyncpg.Connection, job_type: str) -> dict[str, Any]:
    """What a schedule made: how many jobs, and for which ticks (times of
    `CLOCK_DAY`), as an exercise's answer."""
    ticks = list((await scheduled_jobs(conn, job_type))["tick"])
    return {"jobs": len(ticks), "ticks": ticks}
