"""The benchmarks' tests: every measurement at toy size, so that `make bench`
cannot break unnoticed."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from jobqueue.benchmarks import scenarios


@pytest.fixture
async def bench_url(server_url: str) -> AsyncIterator[str]:
    """A benchmark database of this test's own with the tables the handlers
    write (`scenarios.open_bench`), dropped afterwards. The name is unique:
    dropping the database of a `make bench` running on the same server would
    kill that run."""
    name = f"t{uuid.uuid4().hex[:8]}"
    yield await scenarios.open_bench(name)
    await scenarios.close_bench(name)
