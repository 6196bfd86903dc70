"""The benchmarks' tests: every measurement at toy size, so that `make bench`
cannot break unnoticed."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from jobqueue.benchmarks import quick, scenarios


@pytest.fixture
async def bench_database(server_url: str) -> AsyncIterator[str]:
    """A migrated benchmark database of this test's own, dropped afterwards.
    The name is unique (`jobqueue_bench_<hex>`): the fixed `jobqueue_bench`
    belongs to `make bench`, and dropping it while a benchmark runs on the
    same server would kill that run."""
    name = f"{quick.BENCH_DATABASE}_{uuid.uuid4().hex[:12]}"
    yield await quick.prepare_database(server_url, name)
    await quick.drop_bench_database(server_url, name)


@pytest.fixture
async def bench_url(server_url: str) -> AsyncIterator[str]:
    """A benchmark database of this test's own with the tables the handlers
    write (`scenarios.open_bench`), dropped afterwards."""
    name = f"t{uuid.uuid4().hex[:8]}"
    yield await scenarios.open_bench(name)
    await scenarios.close_bench(name)
