"""Each kind of batch's hand-back rule, and the worker's config: unit tests
with no database."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from jobqueue import JobRunner
from jobqueue.worker import WorkerConfig
from jobqueue.worker.batch import CLAIMED, TAKEN


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
