"""`noop` and `write_row` as sync (plain `def`) handlers, which a worker runs
in threads (`jobqueue.worker.threads`): `--import jobqueue.benchmarks.sync_handlers`.

A module of their own, so that the workers of every other benchmark, which
import `jobqueue.benchmarks.handlers`, have no sync handlers and so no lane
and no connections for them.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from jobqueue import current_job
from jobqueue.benchmarks.handlers import INSERT_ROW
from jobqueue.registry import handlers


@handlers.register("noop_sync")
def noop_sync(session: Session, payload: dict[str, Any]) -> None:
    """Does nothing, in a thread: what the two commits of a sync job cost."""


@handlers.register("write_row_sync")
def write_row_sync(session: Session, payload: dict[str, Any]) -> None:
    """One row through the sync session; it commits with the job's completion."""
    session.execute(text(INSERT_ROW), {"id": current_job().id})
