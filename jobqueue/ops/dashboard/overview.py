"""What the overview shows, read once for every viewer.

The counts by status and queue come from `routing.read` (the same reading
`/metrics` makes; finished jobs estimated past `routing.EXACT_FINISHED`), the
table's upkeep from `queue_health`,
the workers from their table, what holds back vacuum from `horizon`.
However many browsers watch, that is read at most once per `Overview.ttl`
seconds per dashboard.

The charts need finished jobs per time bucket over the last minutes. A
`Series` reads its whole window once, then on each refresh only its last
two buckets (`dashboard_series`; older buckets are final), and keeps the
rest in memory: a refresh reads a few seconds of finished jobs through
idx_jobs_finished, not ten minutes of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from jobqueue.ops import horizon, routing
from jobqueue.ops.reads import READ_TIMEOUT, Shared, bounded
from jobqueue.ops.routing import Routing
from jobqueue.schema.queries import queries

__all__ = ["Bucket", "Overview", "Series", "Snapshot"]

Executor = AsyncConnection | AsyncSession


@dataclass(frozen=True)
class Bucket:
    """Jobs finished in one bucket: completed, failed for good, and the p50
    and p99 of due → completion of the completed ones (None: none completed)."""

    start: float
    completed: int = 0
    failed: int = 0
    p50: float | None = None
    p99: float | None = None


@dataclass
class Series:
    """Finished jobs per `width`-second bucket over the last `span` seconds."""

    width: float = 10.0
    span: float = 600.0
    buckets: dict[float, Bucket] = field(default_factory=dict)
    now: float = 0.0
    _read_once: bool = False

    async def refresh(self, conn: Executor) -> None:
        back = math.ceil(self.span / self.width) if not self._read_once else 1
        rows = list((await conn.execute(queries["dashboard_series"].text,
                                        {"width": self.width, "back": back})).mappings())
        self.now, since = float(rows[0]["now"]), float(rows[0]["since"])
        for start in [s for s in self.buckets if s >= since]:
            del self.buckets[start]
        for r in rows:
            if r["bucket"] is not None:
                p50, p99 = r["latency"] or (None, None)
                self.buckets[float(r["bucket"])] = Bucket(
                    float(r["bucket"]), int(r["completed"]), int(r["failed"]), p50, p99)
        oldest = self.first()
        for start in [s for s in self.buckets if s < oldest]:
            del self.buckets[start]
        self._read_once = True

    def first(self) -> float:
        return (math.floor(self.now / self.width) - math.ceil(self.span / self.width)) \
            * self.width

    def points(self) -> list[Bucket]:
        """Every bucket of the window, oldest first, empty ones included; the
        current bucket is still filling and is left out."""
        current = math.floor(self.now / self.width) * self.width
        starts = [self.first() + i * self.width
                  for i in range(math.ceil(self.span / self.width))]
        return [self.buckets.get(s, Bucket(s)) for s in starts if s < current]


@dataclass(frozen=True)
class Snapshot:
    """One reading of everything the overview shows."""

    read_at: float  # the database's clock, epoch seconds
    routes: routing.Routing
    health: dict[str, Any]
    series: list[Bucket]
    width: float
    horizon: dict[str, Any] | None = None  # what holds back vacuum (`horizon.Holder`)

    # Worked out once per reading, however many viewers render it.
    @cached_property
    def counts(self) -> dict[str, int]:
        return self.routes.counts()

    @cached_property
    def queues(self) -> list[dict[str, Any]]:
        return self.routes.queues()

    @cached_property
    def oldest_due_age(self) -> float | None:
        return self.routes.oldest_due_age()

    @cached_property
    def unserved(self) -> list[dict[str, Any]]:
        return self.routes.unserved()

    @cached_property
    def workers(self) -> list[dict[str, Any]]:
        live = {w["id"] for w in routing.live_workers(self.routes.workers)}
        return [{**w, "live": w["id"] in live} for w in self.routes.workers]

    @cached_property
    def throughput(self) -> float:
        """Finished jobs per second over the last minute of full buckets."""
        recent = self.series[-max(1, round(60 / self.width)):]
        return sum(b.completed + b.failed for b in recent) / (len(recent) * self.width) \
            if recent else 0.0


class Overview:
    """The latest `Snapshot`, re-read when older than `ttl` seconds."""

    def __init__(self, ttl: float = 1.5, width: float = 10.0, span: float = 600.0,
                 timeout: float = READ_TIMEOUT, routes: Shared[Routing] | None = None) -> None:
        self.ttl, self.timeout = ttl, timeout
        self._routes = Shared(routing.read, ttl) if routes is None else routes
        self._series = Series(width, span)
        self._shared = Shared(self._read, ttl)

    async def get(self, conn: Executor) -> Snapshot:
        return await self._shared.get(conn)

    def forget(self) -> None:
        """The next viewer reads afresh: a change was made from the page."""
        self._shared.forget()
        self._routes.forget()

    async def _read(self, conn: Executor) -> Snapshot:
        async with bounded(conn, self.timeout):
            routes = await self._routes.get(conn)
            health = dict((await conn.execute(queries["queue_health"].text)).mappings().one())
            holder = await horizon.oldest(conn)
            await self._series.refresh(conn)
        return Snapshot(self._series.now, routes, health, self._series.points(),
                        self._series.width, None if holder is None else holder.as_dict())
