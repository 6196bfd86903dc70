"""Handlers for tests that run real worker processes (`--import tests.handlers`).

Each records what happened in the test database: `events` outside the job's
transaction (visible at once, kept even when the job rolls back) and `effects`
through the handler's own session (committed exactly when the job is).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from typing import Any

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from jobqueue import db
from jobqueue.registry import handlers
from jobqueue.worker import current_job

_events: asyncpg.Connection | None = None
_events_lock: asyncio.Lock | None = None


async def record_event(job_id: uuid.UUID, kind: str) -> None:
    """Write outside the job's transaction, on a connection of our own (one at
    a time: a worker's lanes run handlers side by side)."""
    global _events, _events_lock
    if _events_lock is None:
        _events_lock = asyncio.Lock()
    async with _events_lock:
        if _events is None or _events.is_closed():
            _events = await asyncpg.connect(**db.asyncpg_connect_args(db.database_url()))
        await _events.execute(
            "INSERT INTO events (job_id, kind, worker_pid) VALUES ($1, $2, $3)",
            job_id, kind, os.getpid(),
        )


@handlers.register("effect")
async def effect(session: AsyncSession, payload: dict[str, Any]) -> dict[str, Any]:
    """Start, write an effect, optionally sleep, optionally fail."""
    job_id = current_job().id
    await record_event(job_id, "started")
    await session.execute(text("INSERT INTO effects (job_id) VALUES (:id)"), {"id": job_id})
    if payload.get("sleep"):
        await asyncio.sleep(float(payload["sleep"]))
    if payload.get("fail"):
        raise RuntimeError("asked to fail")
    await record_event(job_id, "finished")
    return {"ok": True}


@handlers.register("noop")
async def noop(session: AsyncSession, payload: dict[str, Any]) -> None:
    return None


@handlers.register("sleep")
async def sleep(session: AsyncSession, payload: dict[str, Any]) -> None:
    """Take `seconds` (a slow job that writes nothing)."""
    await asyncio.sleep(float(payload.get("seconds", 0.05)))


@handlers.register("poison")
async def poison(session: AsyncSession, payload: dict[str, Any]) -> None:
    """Take the worker down with it, every time (as a segfault or the OOM
    killer would): after writing, so a write that survived would show."""
    job_id = current_job().id
    await record_event(job_id, "started")
    await session.execute(text("INSERT INTO effects (job_id) VALUES (:id)"), {"id": job_id})
    os.kill(os.getpid(), signal.SIGKILL)


@handlers.register("block")
async def block(session: AsyncSession, payload: dict[str, Any]) -> None:
    """Write, then block the event loop (`time.sleep` in an async handler: a
    mistake nothing can interrupt, the worker's heartbeat included)."""
    job_id = current_job().id
    await record_event(job_id, "started")
    await session.execute(text("INSERT INTO effects (job_id) VALUES (:id)"), {"id": job_id})
    time.sleep(float(payload["seconds"]))
