"""What the queue looks like right now, read from the database.

Used by `jobqueue status` (and by anything else that wants the same figures):
counts by status (the finished ones estimated past `routing.EXACT_FINISHED`),
and throughput, latency and error rate of the last minutes,
the most frequent recent errors and how long the oldest due job has waited,
all computed by PostgreSQL from the jobs table itself; each queue's counts
and settings, and the due jobs no live worker takes (`routing`), which is
why jobs of a type nobody handles wait; and what holds back vacuum (`horizon`),
which is why dead row versions pile up. `job_dict` gives one job
JSON-ready, as `jobqueue status JOB_ID` and the HTTP API show it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import asyncpg

from jobqueue import db
from jobqueue.ops import held, horizon, routing
from jobqueue.schema.queries import queries


def _ms(values: list[float] | None) -> dict[str, float | None]:
    keys = ("p50", "p95", "p99")
    if not values:
        return dict.fromkeys(keys)
    return {k: None if v is None else round(v * 1000, 2) for k, v in zip(keys, values, strict=True)}


#: How many of the most frequent recent errors `queue_summary` lists.
TOP_ERRORS = 5


async def queue_summary(conn: asyncpg.Connection, window: float = 300.0) -> dict[str, Any]:
    """Counts by status and by queue, the due jobs no live worker takes, plus
    the last `window` seconds of work."""
    routes = await routing.read(conn)
    counts = routes.counts()
    recent = await queries["recent_finished"].fetchrow(conn, window=window)
    workers = routes.workers
    errors = await queries["recent_errors"].fetch(conn, window=window, limit=TOP_ERRORS)
    failed_attempts = errors[0]["failed_attempts"] if errors else 0
    health = await queries["queue_health"].fetchrow(conn)
    holder = await horizon.oldest(conn)
    assert recent is not None and health is not None
    attempts = recent["completed"] + failed_attempts
    return {
        "counts": counts,
        "total": sum(counts.values()),
        # The statuses whose counts (and so the total) are estimates (`routing`).
        "estimated": list(routes.estimated),
        "oldest_pending_age_seconds": routes.oldest_due_age(),
        "dead_tuples": health["dead_tuples"],
        "horizon": None if holder is None else holder.as_dict(),
        "window_seconds": window,
        "recent": {
            "completed": recent["completed"],
            "failed": recent["failed"],
            "failed_attempts": failed_attempts,
            "throughput_per_sec": round((recent["completed"] + recent["failed"]) / window, 2),
            "error_rate": round(failed_attempts / attempts, 4) if attempts else 0.0,
            "latency_ms": _ms(recent["latency"]),
            "run_time_ms": _ms(recent["run_time"]),
            "top_errors": [
                {"job_type": e["job_type"], "error": e["error"], "count": e["n"],
                 "last_at": e["last_at"].isoformat()}
                for e in errors
            ],
        },
        "queues": routes.queues(),
        "unserved": routes.unserved(),
        "workers": [
            {"id": w["id"], "name": w["name"], "mode": w["mode"], "state": w["state"],
             "since": w["started_at"].isoformat(),
             "heartbeat_age_seconds": round(float(w["heartbeat_age"]), 3),
             "queues": w["queues"], "job_types": w["job_types"]}
            for w in workers
        ],
    }


async def job_detail(conn: asyncpg.Connection, job_id: uuid.UUID) -> dict[str, Any] | None:
    """Everything about one job, JSON-ready; None if there is no such job."""
    row = await queries["get_job"].fetchrow(conn, id=job_id)
    if row is None:
        return None
    return job_dict((await held.read(conn, [job_id])).shown(dict(row)))


def attempts(status: str, error_history: list[Any]) -> int:
    """Attempts made: the failed ones recorded, plus a running or successful one."""
    return len(error_history) + (status in ("processing", "completed"))


def job_dict(row: Mapping[Any, Any]) -> dict[str, Any]:
    """A `get_job` row JSON-ready: ISO 8601 times, ids as text, JSON decoded,
    and `attempts` after `max_retries`."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, datetime):
            value = value.isoformat()
        elif isinstance(value, uuid.UUID):
            value = str(value)
        elif key in ("payload", "error_history", "result") and isinstance(value, str):
            value = json.loads(value)
        out[key] = value
        if key == "max_retries":
            out["attempts"] = attempts(row["status"], _history(row["error_history"]))
    return out


def _history(value: Any) -> list[Any]:
    return json.loads(value) if isinstance(value, str) else list(value or [])


async def summary(url: str | None = None, window: float = 300.0) -> dict[str, Any]:
    conn = await db.connect(db.database_url(url), application_name="jobqueue status")
    try:
        return await queue_summary(conn, window)
    finally:
        await conn.close()
