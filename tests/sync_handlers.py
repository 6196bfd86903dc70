"""Sync (plain `def`) handlers for tests that run real worker processes
(`--import tests.sync_handlers`), beside the async ones of `tests.handlers`,
which this module imports so that one worker runs both kinds.

`sync_effect` records `started` in `events` on a connection of its own
(visible at once, kept even when the job rolls back) and writes `effects`
through its session (committed exactly when the job is), then blocks the
way sync code does: `time.sleep`, until a gate file exists or for
`sleep` seconds.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

import tests.handlers  # noqa: F401  (the async handlers, in the same worker)
from jobqueue import current_job, db
from jobqueue.registry import handlers

_events: Engine | None = None
_lock = threading.Lock()


def record_event(kind: str) -> None:
    global _events
    with _lock:
        if _events is None:
            _events = create_engine(db.sync_url(db.database_url()),
                                    isolation_level="AUTOCOMMIT")
    with _events.connect() as conn:
        conn.execute(text("INSERT INTO events (job_id, kind, worker_pid) VALUES (:id, :k, :p)"),
                     {"id": current_job().id, "k": kind, "p": os.getpid()})


@handlers.register("sync_effect")
def sync_effect(session: Session, payload: dict[str, Any]) -> dict[str, Any]:
    job = current_job()
    record_event("started")
    session.execute(text("INSERT INTO effects (job_id) VALUES (:id)"), {"id": job.id})
    if payload.get("gate"):
        deadline = time.monotonic() + float(payload.get("sleep", 120))
        while not os.path.exists(payload["gate"]) and time.monotonic() < deadline:
            time.sleep(0.05)
    elif payload.get("sleep"):
        time.sleep(float(payload["sleep"]))
    record_event("finished")
    return {"job_id": str(job.id), "thread": threading.current_thread().name}
