"""`python -m jobqueue.benchmarks.quick`, small: it must run, lose nothing and
report sane figures. It works in a benchmark database of its own
(`bench_database`), not in the per-test database of the other tests."""

from __future__ import annotations

import pytest

from jobqueue import db
from jobqueue.benchmarks import quick as bench
from jobqueue.worker import DEFAULT_CONCURRENCY


@pytest.fixture
def bench_url(bench_database: str) -> str:
    return bench_database


def _ordered(result: dict, prefix: str) -> None:
    p50, p95, p99 = (result[f"{prefix}p{q}_ms"] for q in (50, 95, 99))
    assert 0 < p50 <= p95 <= p99


async def test_drain_and_lone_job_latency(bench_url: str) -> None:
    drained = await bench.drain_benchmark(bench_url, 50, batch_size=20)
    assert drained["n"] == 50
    assert drained["seconds"] > 0 and drained["jobs_per_sec"] > 0
    assert (drained["batch_size"], drained["concurrency"]) == (20, DEFAULT_CONCURRENCY)
    _ordered(drained, "")
    conn = await db.connect(bench_url)
    try:
        # drain_benchmark raises if any job is not completed; check it independently.
        assert await conn.fetchval("SELECT count(*) FROM jobs WHERE status = 'completed'") == 50
    finally:
        await conn.close()

    lone = await bench.lone_job_latency(bench_url, samples=5)
    assert lone["samples"] == 5
    _ordered(lone, "db_")
    _ordered(lone, "client_")


async def test_refuses_other_databases(server_url: str) -> None:
    """It truncates `jobs`: never on a database that is not the benchmark's."""
    for name in ("jobqueue", "jobqueue_benchmark_of_prod"):
        with pytest.raises(ValueError, match="jobqueue_bench"):
            await bench.drain_benchmark(db.with_database(server_url, name), 10)
    with pytest.raises(ValueError, match="jobqueue_bench"):
        await bench.prepare_database(server_url, "jobqueue")


def test_percentiles_match_percentile_cont() -> None:
    assert bench.percentiles([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx((3.0, 4.8, 4.96))
