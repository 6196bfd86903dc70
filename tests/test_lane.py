"""A lane's plan for its next batch, and each kind of batch's hand-back rule:
unit tests with a config and no database."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

import pytest

from jobqueue import HandlerRegistry, JobRunner
from jobqueue.worker import WorkerConfig
from jobqueue.worker.alone import AloneGate
from jobqueue.worker.batch import CLAIMED, TAKEN
from jobqueue.worker.book import QueueBook
from jobqueue.worker.doorbell import Doorbell
from jobqueue.worker.floors import Floors
from jobqueue.worker.handler import SAVEPOINT_LIMIT
from jobqueue.worker.lane import Lane, Life, Plan
from jobqueue.worker.stats import WorkerStats


def lane(per_job: float | None = None, savepoints_per_job: float = 0.0, lone: bool = False,
         **settings: object) -> Lane:
    async def hand_back(ids: list[uuid.UUID] | None) -> int:
        raise AssertionError("planning hands nothing back")

    life = Life(worker_id=1, registry=HandlerRegistry(), stats=WorkerStats(),
                isolated_types=set(), bell=Doorbell(), stop=asyncio.Event(),
                abandon=asyncio.Event(), hand_back=hand_back, cancel_statement=hand_back,
                record_batch=hand_back, alone=AloneGate(),
                book=QueueBook(1.0), floors=Floors(), job_types=[])
    made = Lane(WorkerConfig(**settings), life, engine=None, number=0)  # type: ignore[arg-type]
    made.per_job, made.savepoints_per_job = per_job, savepoints_per_job
    made.lone = lone
    return made


def test_a_new_lane_claims_one_job_to_learn_the_pace() -> None:
    assert lane().plan() == Plan(take=False, limit=1)


def test_fast_jobs_are_taken_in_batches_sized_to_last_quick_batch() -> None:
    assert lane(per_job=0.0001).plan() == Plan(take=True, limit=500)  # 50 ms of 0.1 ms jobs
    assert lane(per_job=0.0001, quick_batch=0.01).plan() == Plan(take=True, limit=100)
    assert lane(per_job=0.0).plan() == Plan(take=True, limit=1000)  # no-ops: batch_size
    assert lane(per_job=0.0, batch_size=10).plan() == Plan(take=True, limit=10)
    assert lane(per_job=0.049).plan() == Plan(take=True, limit=1)  # never fewer than one


def test_a_lane_whose_last_claim_saw_nothing_else_due_claims_one_job() -> None:
    """Fast jobs, but the last batch was the only one due: the next job most
    likely arrives alone, and a claimed job of its own costs fewer round trips."""
    assert lane(per_job=0.0001, lone=True).plan() == Plan(take=False, limit=1)
    assert lane(per_job=0.0001, lone=False).plan() == Plan(take=True, limit=500)
    # Without quick batches nothing is taken anyway: claims of batch_size.
    assert lane(per_job=0.0001, lone=True, quick_batch=0).plan() == Plan(take=False,
                                                                         limit=1000)


def test_slow_jobs_are_claimed_one_at_a_time() -> None:
    assert lane(per_job=0.051).plan() == Plan(take=False, limit=1)
    assert lane(per_job=2.0, quick_batch=5.0).plan() == Plan(take=True, limit=2)


def test_without_quick_batches_every_batch_is_claimed_up_to_batch_size() -> None:
    assert lane(quick_batch=0).plan() == Plan(take=False, limit=1000)
    assert lane(per_job=0.0001, quick_batch=0, batch_size=50).plan() == Plan(False, 50)


def test_jobs_that_open_savepoints_stay_under_the_subtransaction_cache() -> None:
    assert lane(per_job=0.0, savepoints_per_job=1.0).plan() == Plan(True, SAVEPOINT_LIMIT)
    assert lane(per_job=0.0, savepoints_per_job=0.5).plan() == Plan(True, 2 * SAVEPOINT_LIMIT)
    assert lane(savepoints_per_job=1.0, quick_batch=0).plan() == Plan(False, SAVEPOINT_LIMIT)
    assert lane(per_job=0.0, savepoints_per_job=1e-9).plan().limit == 1000


def test_the_pace_follows_recent_batches() -> None:
    made = lane()
    made._pace(seconds=0.001, jobs=10, savepoints=0)  # the first batch sets it
    assert made.per_job == pytest.approx(0.0001) and made.plan() == Plan(True, 500)
    for _ in range(30):  # then the jobs become slow
        made._pace(seconds=1.0, jobs=1, savepoints=1)
    assert made.plan() == Plan(take=False, limit=1) and made.savepoints_per_job > 0.99


def test_claimed_jobs_go_back_explicitly_taken_ones_are_released_by_their_transaction(
) -> None:
    ids = [uuid.uuid4(), uuid.uuid4()]
    assert CLAIMED.to_hand_back(ids) == ids and not CLAIMED.taken
    assert TAKEN.to_hand_back(ids) == [] and TAKEN.taken


def test_the_config_is_checked_once_and_frozen() -> None:
    config = WorkerConfig(lease=2.0)
    assert config.tick == 0.5 and config.statement_timeout == 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.lease = 1.0  # type: ignore[misc]
    with pytest.raises(ValueError, match="lease must be at least 0.5"):
        WorkerConfig(lease=0.1)
    with pytest.raises(ValueError, match="quick batch must be a finite"):
        JobRunner(quick_batch=float("inf"))
    assert JobRunner(config=config).config is config
    with pytest.raises(TypeError, match="not both"):
        JobRunner(config=config, lease=3.0)
