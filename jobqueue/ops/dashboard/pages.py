"""The job list and the job page: what they read and how a page follows
the one before.

Each tab of the list is read in the order of an index it can walk and stop
(`queries.sql`, the `dashboard_*` statements): waiting jobs in the order
workers take them, running ones by start, completed and failed ones by when
they finished. The next page starts after the last row of this one (a
keyset, handed to the browser as an opaque cursor), so the thousandth page
costs what the first does and rows added meanwhile shift nothing.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from jobqueue.enqueue import check_queue
from jobqueue.errors import shown
from jobqueue.ops import held
from jobqueue.schema.models import PRIORITY_MAX, PRIORITY_MIN
from jobqueue.schema.queries import queries

__all__ = ["PAGE_SIZE", "TABS", "Page", "job", "list_jobs", "pretty_json"]

Executor = AsyncConnection | AsyncSession

#: The list's tabs: the statement each reads, and what its time column means.
TABS: dict[str, tuple[str, str]] = {
    "waiting": ("dashboard_waiting", "due"),
    "running": ("dashboard_running", "started"),
    "failed": ("dashboard_failed", "failed"),
    "completed": ("dashboard_completed", "completed"),
}
PAGE_SIZE = 50
#: What a cursor that is not one of ours gets (edited, truncated, from another list).
DAMAGED = "that page link is damaged; start again from the first page"
_LAST_ID = uuid.UUID(int=(1 << 128) - 1)
_INFINITY = datetime.max.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Page:
    rows: list[dict[str, Any]]
    next: str | None  # the cursor of the following page; None: this is the last


def _encode(values: list[Any]) -> str:
    raw = json.dumps(values, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode(cursor: str, size: int) -> list[Any]:
    values = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    if not isinstance(values, list) or len(values) != size:
        raise ValueError(DAMAGED)
    return values


def _time(text: Any) -> datetime:
    at = datetime.fromisoformat(text)
    if at.tzinfo is None:
        raise ValueError(DAMAGED)
    return in_range(at)


def in_range(at: datetime) -> datetime:
    """`at`, if PostgreSQL can be sent it: a time whose UTC falls outside the
    years 1-9999 (0001-01-01 at +14:00) fails the driver's encoding, which
    was a 500; a ValueError instead."""
    try:
        at.astimezone(UTC)
    except OverflowError:
        raise ValueError("that time is out of range") from None
    return at


def _params(tab: str, queue: str | None, before: datetime | None,
            cursor: str | None) -> dict[str, Any]:
    """The statement's keyset parameters for the first page or the one after `cursor`."""
    if tab == "waiting":
        if cursor is None:
            return {"queue": queue or "", "priority": PRIORITY_MAX + 1, "run_at": _INFINITY,
                    "id": _LAST_ID, "one_queue": queue is not None}
        q, priority, run_at, last = _decode(cursor, 4)
        if not isinstance(q, str) or not isinstance(priority, int) \
                or not PRIORITY_MIN <= priority <= PRIORITY_MAX + 1 \
                or (queue is not None and q != queue):
            raise ValueError(DAMAGED)
        if q:
            check_queue(q)  # a NUL or a lone surrogate PostgreSQL cannot take
        return {"queue": q, "priority": priority, "run_at": _time(run_at),
                "id": uuid.UUID(str(last)), "one_queue": queue is not None}
    if cursor is None:
        return {"before_at": before or _INFINITY, "before_id": _LAST_ID}
    at, last = _decode(cursor, 2)
    return {"before_at": _time(at), "before_id": uuid.UUID(str(last))}


def _cursor(tab: str, row: dict[str, Any]) -> str:
    if tab == "waiting":
        return _encode([row["queue"], row["priority"], row["run_at"].isoformat(),
                        str(row["id"])])
    return _encode([row["at"].isoformat(), str(row["id"])])


async def list_jobs(conn: Executor, tab: str, *, queue: str | None = None,
                    job_type: str | None = None, before: datetime | None = None,
                    cursor: str | None = None, limit: int = PAGE_SIZE) -> Page:
    """One page of a tab. ValueError: an unknown tab or a damaged cursor."""
    if tab not in TABS:
        raise ValueError(f"no such list: {shown(tab)}")
    try:  # whatever a foreign cursor breaks on, the reader hears the same
        params = _params(tab, queue, before, cursor)
    except (TypeError, ValueError, binascii.Error, RecursionError):
        # RecursionError: a cursor of JSON nested thousands deep (was a 500).
        raise ValueError(DAMAGED) from None
    params.update({"job_type": job_type, "limit": limit + 1})
    if tab != "waiting":
        params["queue"] = queue
    result = await conn.execute(queries[TABS[tab][0]].text, params)
    rows = [dict(r) for r in result.mappings()]
    holding = await held.read(conn)
    if tab == "running":  # with the jobs quick batches hold, which the table calls waiting
        rows = held.merged(rows, holding.running(queue=queue, job_type=job_type), key="at",
                           before=(params["before_at"], params["before_id"]), limit=limit + 1)
    more = len(rows) > limit  # one row past the page says whether another follows
    page, last = rows[:limit], rows[limit - 1] if more else None
    if tab == "waiting":
        page = holding.without(page)
    return Page(page, None if last is None else _cursor(tab, last))


async def job(conn: Executor, job_id: uuid.UUID) -> dict[str, Any] | None:
    """Everything about one job, its JSON columns as PostgreSQL wrote them."""
    row = (await conn.execute(queries["api_get_job"].text, {"id": job_id})).mappings().first()
    if row is None:
        return None
    out = (await held.read(conn, [job_id])).shown(dict(row))
    try:
        out["error_history"] = json.loads(row["error_history"] or "[]")
    except RecursionError:  # written by the queue: never nested; but be safe
        out["error_history"] = []
    return out


def pretty_json(raw: str | None) -> str:
    """JSON text indented for reading; as stored when Python cannot nest
    that deep (PostgreSQL can)."""
    if raw is None:
        return "null"
    try:
        return json.dumps(json.loads(raw), indent=2, ensure_ascii=False)
    except RecursionError:
        return raw
