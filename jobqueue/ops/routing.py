"""Who takes what: each queue's jobs and settings, and the waiting jobs that
no live worker takes (issue #18).

A worker takes a job when it serves the job's queue (its `queues`; NULL:
every queue) and has a handler for the job's type (the `job_types` it
registered as its life began). A job whose (queue, type) no live worker
covers waits without any error: a type only the next release knows, a queue
no worker was started for. `jobqueue status`, `jobqueue queue list`, `GET
/queues` and `/metrics` read it all from here, so they agree.

The counts never pass over the table's history (issue #34). Unfinished
jobs are counted exactly from the indexes that hold only them
(`count_unfinished`): the cost grows with what waits and runs, not with
what finished. Finished jobs are counted too while there are few (up to
`EXACT_FINISHED`); past that, they are estimated from PostgreSQL's
statistics (`estimate_finished`), and `Routing.estimated` names the
statuses whose figures are estimates, so that every surface can say so.
The settings and the workers come from the two small tables
`jobqueue_queues` and `jobqueue_workers`; the matching of due jobs against
the workers' rows is done here, in Python, because there are only ever a
handful of workers.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeAlias

import asyncpg
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from jobqueue.ops import held
from jobqueue.queues import Rate
from jobqueue.schema.models import STATUS_VALUES
from jobqueue.schema.queries import queries

#: Seconds of silence after which a worker no longer counts as taking jobs.
#: A worker beats at least every 0.5 s whatever its lease, so this is many
#: missed beats; it also covers a crashed worker's row that nobody fenced yet
#: (fencing needs another live worker).
HEARTBEAT_FRESH = 10.0
#: Worker states that take jobs; a standby takes none until it takes over.
WORKING_STATES = ("active", "shared")
WAITING = held.WAITING
RUNNING = held.RUNNING
FINISHED = ("completed", "failed")
#: Finished jobs are counted exactly up to this many (a pass over them all,
#: a few ms per ten thousand); past it, they are estimated.
EXACT_FINISHED = 50_000

Conn: TypeAlias = asyncpg.Connection | AsyncConnection | AsyncSession


@dataclass(frozen=True)
class Group:
    """Jobs of one status, queue and type. An estimate of finished jobs too
    rare in PostgreSQL's sample to be told by queue and type has neither."""

    status: str
    queue: str | None
    job_type: str | None
    n: int
    due: int = 0  # of the waiting ones: due now
    oldest_due_age: float | None = None  # seconds the earliest due one has been due


@dataclass(frozen=True)
class Settings:
    """A queue's row in jobqueue_queues (a queue without one: not paused, no limits)."""

    paused: bool = False
    concurrency: int | None = None
    rate: Rate | None = None


@dataclass
class Routing:
    """The jobs by status, queue and type; the queues' settings; the workers."""

    groups: list[Group] = field(default_factory=list)
    settings: dict[str, Settings] = field(default_factory=dict)
    workers: list[dict[str, Any]] = field(default_factory=list)
    #: The statuses whose counts are estimates, not counts.
    estimated: tuple[str, ...] = ()

    def counts(self) -> dict[str, int]:
        """Jobs by status, every status present."""
        counts = dict.fromkeys(STATUS_VALUES, 0)
        for g in self.groups:
            counts[g.status] = counts.get(g.status, 0) + g.n
        return counts

    def queues(self) -> list[dict[str, Any]]:
        """Each queue that has jobs or settings, by name, JSON-ready."""
        names = sorted({g.queue for g in self.groups if g.queue is not None}
                       | set(self.settings))
        counts: dict[str, dict[str, int]] = {q: dict.fromkeys(STATUS_VALUES, 0) for q in names}
        oldest: dict[str, float] = {}
        for g in self.groups:
            if g.queue is None:
                continue
            counts[g.queue][g.status] += g.n
            if g.oldest_due_age is not None:
                oldest[g.queue] = max(oldest.get(g.queue, g.oldest_due_age), g.oldest_due_age)
        return [{"queue": q, "counts": counts[q], "running": counts[q]["processing"],
                 "oldest_due_age_seconds": _seconds(oldest.get(q)),
                 **settings_dict(self.settings.get(q, Settings()))} for q in names]

    def oldest_due_age(self) -> float | None:
        """Seconds the longest-waiting due job has been due; None: none is due."""
        ages = [g.oldest_due_age for g in self.groups if g.oldest_due_age is not None]
        return _seconds(max(ages)) if ages else None

    def unserved(self, fresh: float = HEARTBEAT_FRESH) -> list[dict[str, Any]]:
        """Due waiting jobs that no live worker takes, by queue and type,
        longest-waiting first, JSON-ready."""
        takers = live_workers(self.workers, fresh)
        found: dict[tuple[str, str], list[Any]] = defaultdict(lambda: [0, None])
        for g in self.groups:
            if g.queue is None or g.job_type is None or g.status not in WAITING or not g.due:
                continue
            if not any(takes(w, g.queue, g.job_type) for w in takers):
                entry = found[(g.queue, g.job_type)]
                entry[0] += g.due
                entry[1] = max(entry[1] or 0.0, g.oldest_due_age or 0.0)
        rows = [{"queue": q, "job_type": t, "count": n, "oldest_due_age_seconds": _seconds(age)}
                for (q, t), (n, age) in found.items()]
        return sorted(rows, key=lambda r: (-(r["oldest_due_age_seconds"] or 0),
                                           r["queue"], r["job_type"]))


def live_workers(workers: list[dict[str, Any]], fresh: float = HEARTBEAT_FRESH
                 ) -> list[dict[str, Any]]:
    """Workers at work whose heartbeat is fresh."""
    return [w for w in workers
            if w["state"] in WORKING_STATES and float(w["heartbeat_age"]) <= fresh]


def takes(worker: Mapping[str, Any], queue: str, job_type: str) -> bool:
    """Whether `worker` (a `workers` row) claims jobs of this queue and type."""
    queues = worker.get("queues")
    return (queues is None or queue in queues) and job_type in (worker.get("job_types") or ())


def settings_dict(s: Settings) -> dict[str, Any]:
    """A queue's settings as the CLI's --json and the API show them."""
    return {"paused": s.paused, "concurrency": s.concurrency,
            "rate": None if s.rate is None else str(s.rate)}


def settings_line(queue: str, s: Settings) -> str:
    """One line for a person: `queue emails: paused; concurrency 4; rate 20/s`."""
    return (f"queue {queue}: {'paused' if s.paused else 'not paused'}; "
            + ("no concurrency limit" if s.concurrency is None
               else f"concurrency {s.concurrency}") + "; "
            + ("no rate limit" if s.rate is None else f"rate {s.rate}"))


def _seconds(value: float | None) -> float | None:
    # The reading's now() is its transaction's start: a job due since then
    # would be a few ms in the future.
    return None if value is None else round(max(float(value), 0.0), 3)


def _unfinished(rows: list[dict[str, Any]]) -> list[Group]:
    """`count_unfinished`'s rows as groups: pending is waiting minus
    retrying; the due figures count for waiting jobs only."""
    by_key = {(r["status"], r["queue"], r["job_type"]): r for r in rows}
    groups = []
    for (status, queue, job_type), r in by_key.items():
        if status == "waiting":
            retrying = by_key.get(("retrying", queue, job_type), {"n": 0, "due": 0})
            r = {**r, "n": r["n"] - retrying["n"], "due": r["due"] - retrying["due"]}
            status = "pending"
            if not r["n"]:
                continue
        due = int(r["due"]) if status in WAITING else 0
        groups.append(Group(status, queue, job_type, int(r["n"]), due,
                            r["oldest_age"] if due else None))
    return groups


async def read_finished(conn: Conn, exact_upto: int = EXACT_FINISHED
                        ) -> tuple[list[Group], bool]:
    """The finished jobs by status, queue and type, and whether the figures
    are estimates. The history's are exact (its counts table). Those still
    in `jobs` (until the leader moves them, a minute or so) are counted
    while there are no more than `exact_upto`, else estimated (counted after
    all where PostgreSQL has no statistics yet): many only where the
    history is not kept up (no worker of this release running yet)."""
    probe = await queries["count_finished_upto"].rows(conn, cap=exact_upto + 1)
    estimated = False
    if probe[0]["n"] > exact_upto:
        rows = await queries["estimate_finished"].rows(conn)
        estimated = bool(rows)
    if estimated:  # the estimate is of `jobs`: the history's counts are added to it
        rows += await queries["history_counts"].rows(conn)
    else:  # both, counted in one snapshot
        rows = await queries["count_finished"].rows(conn)
    totals: Counter[tuple[str, str | None, str | None]] = Counter()
    for r in rows:
        totals[(r["status"], r["queue"], r["job_type"])] += int(r["n"])
    return [Group(status, queue, job_type, n)
            for (status, queue, job_type), n in totals.items() if n], estimated


async def read_settings(conn: Conn) -> dict[str, Settings]:
    """Every configured queue's settings (a tiny table, read whole)."""
    out = {}
    for r in await queries["queue_settings"].rows(conn):
        rate = None if r["rate_limit"] is None else Rate(r["rate_limit"],
                                                         float(r["rate_period"]))
        out[r["name"]] = Settings(r["paused"], r["concurrency"], rate)
    return out


def regroup(groups: list[Group], moved: Counter[tuple[str, str, str]]) -> list[Group]:
    """The table's groups with the jobs live quick batches hold (`moved`, by
    the status the table gives them) counted running, as they are."""
    if not moved:
        return groups
    by_key = {(g.status, g.queue, g.job_type): g for g in groups}
    for (status, queue, job_type), n in moved.items():
        waiting = by_key.get((status, queue, job_type))
        if waiting is None:  # the table moved on between the two reads
            continue
        n = min(n, waiting.n)
        by_key[(status, queue, job_type)] = replace(waiting, n=waiting.n - n,
                                                    due=max(waiting.due - n, 0))
        running = by_key.get((RUNNING, queue, job_type), Group(RUNNING, queue, job_type, 0))
        by_key[(RUNNING, queue, job_type)] = replace(running, n=running.n + n)
    return list(by_key.values())


async def read(conn: Conn, exact_finished: int = EXACT_FINISHED) -> Routing:
    """Read what the surfaces show, with the jobs quick batches hold counted
    running (`held`); finished jobs estimated past `exact_finished`."""
    groups = _unfinished(await queries["count_unfinished"].rows(conn))
    finished, estimated = await read_finished(conn, exact_finished)
    groups = regroup(groups + finished, (await held.read(conn)).moved())
    return Routing(groups, await read_settings(conn), await queries["workers"].rows(conn),
                   FINISHED if estimated else ())


__all__ = ["EXACT_FINISHED", "HEARTBEAT_FRESH", "Group", "Routing", "Settings", "live_workers",
           "read", "read_finished", "read_settings", "settings_dict", "settings_line", "takes"]
