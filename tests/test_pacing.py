"""A lane's plan for its next batch and when a batch stops: `Pacing` is pure
arithmetic, tested with no database and no clock."""

from __future__ import annotations

import pytest

from jobqueue.worker import WorkerConfig
from jobqueue.worker.pacing import SAVEPOINT_LIMIT, Pacing, Plan


def pacing(per_job: float | None = None, savepoints_per_job: float = 0.0,
           **settings: object) -> Pacing:
    config = WorkerConfig(**settings)  # type: ignore[arg-type]
    made = Pacing(config.batch_size, config.quick_batch)
    made.per_job, made.savepoints_per_job = per_job, savepoints_per_job
    return made


def test_a_new_lane_claims_one_job_to_learn_the_pace() -> None:
    config = WorkerConfig()
    assert Pacing(config.batch_size, config.quick_batch).plan(False) == Plan(False, 1)


def test_fast_jobs_are_taken_in_batches_sized_to_last_quick_batch() -> None:
    assert pacing(per_job=0.0001).plan(False) == Plan(take=True, limit=500)  # 50 ms of 0.1 ms jobs
    assert pacing(per_job=0.0001, quick_batch=0.01).plan(False) == Plan(take=True, limit=100)
    assert pacing(per_job=0.0).plan(False) == Plan(take=True, limit=1000)  # no-ops: batch_size
    assert pacing(per_job=0.0, batch_size=10).plan(False) == Plan(take=True, limit=10)
    assert pacing(per_job=0.049).plan(False) == Plan(take=True, limit=1)  # never fewer than one


def test_a_lane_whose_last_claim_saw_nothing_else_due_claims_one_job() -> None:
    """Fast jobs, but the last batch was the only one due: the next job most
    likely arrives alone, and a claimed job of its own costs fewer round trips."""
    assert pacing(per_job=0.0001).plan(lone=True) == Plan(take=False, limit=1)
    assert pacing(per_job=0.0001).plan(lone=False) == Plan(take=True, limit=500)
    # Without quick batches nothing is taken anyway: claims of batch_size.
    assert pacing(per_job=0.0001, quick_batch=0).plan(lone=True) == Plan(take=False,
                                                                           limit=1000)


def test_slow_jobs_are_claimed_one_at_a_time() -> None:
    assert pacing(per_job=0.051).plan(False) == Plan(take=False, limit=1)
    assert pacing(per_job=2.0, quick_batch=5.0).plan(False) == Plan(take=True, limit=2)


def test_without_quick_batches_every_batch_is_claimed_up_to_batch_size() -> None:
    assert pacing(quick_batch=0).plan(False) == Plan(take=False, limit=1000)
    assert pacing(per_job=0.0001, quick_batch=0, batch_size=50).plan(False) == Plan(False, 50)


def test_jobs_that_open_savepoints_stay_under_the_subtransaction_cache() -> None:
    assert pacing(per_job=0.0, savepoints_per_job=1.0).plan(False) == Plan(True, SAVEPOINT_LIMIT)
    assert pacing(per_job=0.0, savepoints_per_job=0.5).plan(False) == Plan(True,
                                                                       2 * SAVEPOINT_LIMIT)
    assert pacing(savepoints_per_job=1.0, quick_batch=0).plan(False) == Plan(False,
                                                                         SAVEPOINT_LIMIT)
    assert pacing(per_job=0.0, savepoints_per_job=1e-9).plan(False).limit == 1000


def test_the_pace_follows_recent_batches() -> None:
    made = pacing()
    made.ran(seconds=0.001, jobs=10, savepoints=0)  # the first batch sets it
    assert made.per_job == pytest.approx(0.0001) and made.plan(False) == Plan(True, 500)
    for _ in range(30):  # then the jobs become slow
        made.ran(seconds=1.0, jobs=1, savepoints=1)
    assert made.plan(False) == Plan(take=False, limit=1) and made.savepoints_per_job > 0.99


def test_a_quick_batch_that_outruns_quick_batch_stops_a_claimed_one_does_not() -> None:
    made = pacing()
    assert not made.full(taken=True, elapsed=0.049, savepoints=0, job_type="t")
    assert made.full(taken=True, elapsed=0.051, savepoints=0, job_type="t")
    assert not made.full(taken=False, elapsed=10.0, savepoints=0, job_type="t")


def test_a_batch_stops_before_a_job_that_could_pass_the_savepoint_limit() -> None:
    """Judged by the most its type has opened, and at least one."""
    made = pacing()
    assert not made.full(False, 0.0, SAVEPOINT_LIMIT - 1, "t")
    assert made.full(False, 0.0, SAVEPOINT_LIMIT, "t")
    made.opened("nested", 5)
    assert not made.full(False, 0.0, SAVEPOINT_LIMIT - 5, "nested")
    assert made.full(False, 0.0, SAVEPOINT_LIMIT - 4, "nested")
    made.opened("nested", 2)  # the peak stays
    assert made.full(False, 0.0, SAVEPOINT_LIMIT - 4, "nested")
    made.opened("deep", 1000)  # capped: alone it overflows anyway
    assert made.savepoint_peak["deep"] == SAVEPOINT_LIMIT
    assert not made.full(False, 0.0, 0, "deep")  # a fresh batch always runs one job
