"""Jobs running in quick batches, as the surfaces that show jobs see them.

A quick batch locks its jobs and runs them in one transaction without
marking them (one row version per job instead of two), so the jobs table
shows them `pending` until the batch commits: a 15 s job looked like one
nobody had picked up. The batch ledger, written once per batch, names them
(`queries.sql: held`); this module lays that over what the table says, so
`jobqueue status`, the dashboard, `/metrics` and the API show such a job
running, with its worker and its batch's start. The worker writes nothing
more for it: the cost is this read, made by the surfaces.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import asyncpg
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from jobqueue.schema.queries import queries

__all__ = ["RUNNING", "WAITING", "Held", "merged", "read", "status_of"]

Conn: TypeAlias = asyncpg.Connection | AsyncConnection | AsyncSession

#: What the table says of a job a quick batch holds (it was never marked).
WAITING = ("pending", "retrying")
RUNNING = "processing"


@dataclass(frozen=True)
class Held:
    """The jobs live quick batches hold, by id, as the `held` statement read them."""

    rows: dict[uuid.UUID, dict[str, Any]] = field(default_factory=dict)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.rows

    def shown(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """`row` (a job as a statement read it) as the surfaces show it: if a
        batch holds it, running, with the batch's worker and start, and the
        attempt it is making counted. Only a row that still says waiting: a
        batch that committed since the read left the job finished."""
        out = dict(row)
        held = self.rows.get(out.get("id"))  # type: ignore[arg-type]
        if held is None or out.get("status") not in WAITING:
            return out
        out["status"] = RUNNING
        out["started_at"] = held["started_at"]
        if "worker_id" in out:
            out["worker_id"] = held["worker_id"]
        if "attempts" in out:
            out["attempts"] = held["attempts"] + 1
        return out

    def running(self, *, queue: str | None = None, job_type: str | None = None
                ) -> list[dict[str, Any]]:
        """The held jobs, shown running, of one queue and type when given."""
        return [self.shown(r) for r in self.rows.values()
                if (queue is None or r["queue"] == queue)
                and (job_type is None or r["job_type"] == job_type)]

    def without(self, rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """`rows` (waiting jobs) less those a batch holds: they are running."""
        return [r for r in rows if r["id"] not in self.rows]

    def moved(self) -> Counter[tuple[str, str, str]]:
        """How many held jobs each (status, queue, type) of the table counts:
        the counts move these from waiting to running."""
        return Counter((r["status"], r["queue"], r["job_type"]) for r in self.rows.values())


async def read(conn: Conn, ids: Sequence[uuid.UUID] | None = None) -> Held:
    """Every job live quick batches hold, or those of `ids`."""
    rows = await queries["held"].rows(conn, ids=None if ids is None else list(ids))
    return Held({r["id"]: r for r in rows})


async def status_of(conn: Conn, job_id: uuid.UUID) -> str | None:
    """A job's status as the surfaces show it (`processing` while a quick
    batch holds it), for the sentences that name it: a refused retry, a
    cancel still waiting for its worker. None: no such job."""
    found = await queries["job_status"].rows(conn, id=job_id)
    if not found:
        return None
    return str((await read(conn, [job_id])).shown({"id": job_id, **found[0]})["status"])


def merged(rows: list[dict[str, Any]], extra: list[dict[str, Any]], *, key: str,
           before: tuple[Any, Any] | None, limit: int) -> list[dict[str, Any]]:
    """A page of `rows` (newest `key` first, after the keyset `before`) with
    the `extra` rows that belong on it, in the same order; up to `limit`."""
    if before is not None:
        extra = [r for r in extra if (r[key], r["id"]) < before]
    ids = {r["id"] for r in rows}
    together = rows + [r for r in extra if r["id"] not in ids]
    together.sort(key=lambda r: (r[key], r["id"]), reverse=True)
    return together[:limit]
