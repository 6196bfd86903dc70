"""What a worker's lanes share during one life (one worker id)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from jobqueue.registry import HandlerRegistry
from jobqueue.worker.alone import AloneGate
from jobqueue.worker.book import QueueBook
from jobqueue.worker.cancels import Released
from jobqueue.worker.doorbell import Doorbell
from jobqueue.worker.floors import Floors
from jobqueue.worker.stats import WorkerStats


@dataclass(frozen=True)
class Life:
    """What a worker's lanes share during one life (one worker id): given by
    the runner, so that a lane needs neither the runner nor its attributes."""

    worker_id: int
    registry: HandlerRegistry
    stats: WorkerStats
    #: Job types that failed after writing without a savepoint: they run in
    #: savepoints from then on (`savepoints="auto"`); kept across lives.
    isolated_types: set[str]
    #: Wakes idle lanes when new jobs may be due (a notification, or a stop).
    bell: Doorbell
    #: Set by a stop request: take no new batch, start no new job.
    stop: asyncio.Event
    #: Set when running lanes are being cut off on purpose: their errors are expected.
    abandon: asyncio.Event
    #: Return claimed jobs to the queue on the worker's monitor connection.
    hand_back: Callable[[list[uuid.UUID] | None], Awaitable[int]]
    #: Send again the cancels of jobs let go still waiting (`JobRunner.pass_on`).
    pass_on: Callable[[list[uuid.UUID]], Awaitable[None]]
    #: The jobs let go still waiting lately, for a cancel on its way (`cancels.py`).
    released: Released
    #: Cancel the statement a backend runs (by pid), from the monitor connection.
    cancel_statement: Callable[[int], Awaitable[Any]]
    #: Write down a quick batch before it runs: (lane, transaction id, job ids).
    record_batch: Callable[[int, int, list[uuid.UUID]], Awaitable[Any]]
    #: Where the lanes make room for a job that must run alone.
    alone: AloneGate
    #: The queues as this worker last saw them (waiting jobs, settings).
    book: QueueBook
    #: Where each lane's claims start, per queue and priority (`floors.py`).
    floors: Floors
    #: The job types it has handlers for: the only ones it claims.
    job_types: list[str]
