"""Handlers for the tests of cancels with real worker processes
(`--import tests.cancel_handlers`).

`step` (async) and `sync_step` (plain `def`, run in a thread) record
`started` in `events` on a connection of their own (seen at once, kept
even when the job rolls back), write one row of `effects` through their
session (committed exactly when the job is), and then, as the payload says:
wait until a gate file exists (`gate`) and at least `min_s` seconds have
passed, fail their first attempt (`fail_first`), and record `finished`
once they return. A sync one waiting for its gate cannot be stopped (it
never calls the database); an async one can, unless it is `stubborn`: then
it carries on waiting after the first stop. A payload with `quiet` does nothing at all: a lane's
first job, which teaches it that these jobs are fast.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

import tests.sync_handlers as sync_events
from jobqueue import current_job
from jobqueue.registry import handlers
from tests.handlers import record_event

#: Longest a gated job waits for its gate (a test that failed leaves it shut).
GATE_TIMEOUT = 120.0

_EFFECT = text("INSERT INTO effects (job_id) VALUES (:id)")


def _open(payload: dict[str, Any], since: float) -> bool:
    """The gate is open (or there is none) and `min_s` seconds have passed."""
    gate = payload.get("gate")
    return ((gate is None or os.path.exists(gate))
            and time.monotonic() - since >= float(payload.get("min_s", 0)))


def _failing(payload: dict[str, Any]) -> bool:
    return bool(payload.get("fail_first")) and current_job().attempt == 1


@handlers.register("step")
async def step(session: AsyncSession, payload: dict[str, Any]) -> None:
    if payload.get("quiet"):
        return
    job_id, since = current_job().id, time.monotonic()
    await record_event(job_id, "started")
    if not payload.get("fail_first"):  # a plain job that fails after writing reruns its batch
        await session.execute(_EFFECT, {"id": job_id})
    deadline = since + GATE_TIMEOUT
    stops = 1 if payload.get("stubborn") else 0
    while not _open(payload, since) and time.monotonic() < deadline:
        try:
            await asyncio.sleep(0.02)
        except asyncio.CancelledError:
            if not stops:
                raise
            stops -= 1  # swallowed, as some code does
    if _failing(payload):
        raise RuntimeError("asked to fail its first attempt")
    await record_event(job_id, "finished")


@handlers.register("sync_step")
def sync_step(session: Session, payload: dict[str, Any]) -> None:
    since = time.monotonic()
    sync_events.record_event("started")
    session.execute(_EFFECT, {"id": current_job().id})
    deadline = since + GATE_TIMEOUT
    while not _open(payload, since) and time.monotonic() < deadline:
        time.sleep(0.02)
    if _failing(payload):
        raise RuntimeError("asked to fail its first attempt")
    sync_events.record_event("finished")
