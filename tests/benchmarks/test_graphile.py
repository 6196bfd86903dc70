"""graphile-worker, the Node.js peer, at toy size: real PostgreSQL, real node
processes in perfTest's configuration. Skipped where node or npm is missing."""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path

import pytest

from jobqueue import db
from jobqueue.benchmarks import graphile, peers, scenarios

N = 200


@pytest.fixture(scope="module")
def graphile_installed() -> None:
    if not graphile.available():
        pytest.skip("graphile-worker needs node and npm on PATH and its npm package installed")


@pytest.fixture
async def graphile_url(graphile_installed: None, server_url: str) -> AsyncIterator[str]:
    """A database of graphile-worker's own, its schema installed by its CLI."""
    name = f"t{uuid.uuid4().hex[:8]}"
    url = await peers.open_peer("graphile-worker", name)
    yield url
    await scenarios.close_bench(name)


@pytest.mark.parametrize(("handler", "workers", "concurrency"),
                         [("noop", 1, 24), ("noop", 2, 4),
                          ("write_row", 1, 4), ("write_row", 2, 24),
                          ("process_payment", 2, 8)])
async def test_graphile_drains_every_job_exactly_once(
        graphile_url: str, handler: str, workers: int, concurrency: int, tmp_path: Path) -> None:
    row = await peers.drain("graphile-worker", graphile_url, n=N, workers=workers,
                            concurrency=concurrency, handler=handler, timeout=60,
                            log_dir=tmp_path)
    assert row["system"] == "graphile-worker" and row["handler"] == handler
    assert (row["n"], row["workers"], row["concurrency"]) == (N, workers, concurrency)
    assert row["seconds"] > 0 and row["jobs_per_sec"] == pytest.approx(N / row["seconds"])
    procs = f"{workers} process{'es' if workers > 1 else ''}"
    assert row["settings"].startswith(f"concurrency {concurrency}, {procs}, perfTest")
    # The label is read back from the knobs recorded, which are the config file's.
    assert row["argv"] == f"concurrentJobs={concurrency} maxPoolSize={concurrency + 1}"
    assert row["settings"] == peers.label("graphile-worker", row["argv"], workers)
    config = (tmp_path / "graphile.config.cjs").read_text()
    assert f'"concurrentJobs": {concurrency},' in config
    assert f'"maxPoolSize": {concurrency + 1},' in config
    assert row["rss_peak_mib"] > 20  # a node process, sampled while it ran
    conn = await db.connect(graphile_url)
    try:  # seen in graphile's own table and in bench_rows (drain checks this too)
        assert await conn.fetchval("SELECT count(*) FROM graphile_worker._private_jobs") == 0
        written = await conn.fetchrow(
            "SELECT count(*) AS rows, count(DISTINCT job_id) AS jobs,"
            " extract(epoch FROM max(written_at) - min(written_at)) AS span FROM bench_rows")
        paid = await conn.fetchrow("SELECT count(DISTINCT payment_id) AS n,"
                                   " (SELECT sum(balance) FROM demo_users) AS balances"
                                   " FROM demo_payments")
    finally:
        await conn.close()
    if handler == "process_payment":  # each payment once, the balances summing to them
        assert paid["n"] == N
        assert paid["balances"] == sum(Decimal(p["amount"]) for p in scenarios.payments(N))
    else:
        assert paid["n"] == 0
    if handler == "write_row":
        assert (written["rows"], written["jobs"]) == (N, N)
        # Every write falls inside the drain as timed from its first claim to
        # the table seen empty.
        assert float(written["span"]) <= row["seconds"]
    else:
        assert written["rows"] == 0


async def test_a_job_that_cannot_run_fails_the_drain(graphile_url: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # Jobs for a task the workers do not know stay in the table: lost, not done.
    original = graphile.fill

    async def fill_unknown(url: str, n: int, handler: str = "noop") -> graphile.Filled:
        filled = await original(url, n, handler)
        conn = await db.connect(url)
        try:
            await conn.execute("SELECT graphile_worker.add_job('no_such_task')")
        finally:
            await conn.close()
        return filled

    monkeypatch.setitem(peers._PEERS, "graphile-worker",
                        dataclasses.replace(graphile.PEER, fill=fill_unknown))
    with pytest.raises(RuntimeError, match="1 of 20 left"):
        await peers.drain("graphile-worker", graphile_url, n=20, concurrency=2, timeout=60)


def test_install_is_idempotent(graphile_installed: None) -> None:
    folder = graphile.install()
    assert graphile.cli(folder).is_file()
    mtime = (folder / "package.json").stat().st_mtime_ns
    assert graphile.install() == folder
    assert (folder / "package.json").stat().st_mtime_ns == mtime  # nothing reinstalled


def test_without_node_it_is_unavailable_with_one_warning(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(graphile.shutil, "which", lambda tool: None)
    with caplog.at_level(logging.WARNING, logger=graphile.__name__):
        assert graphile.available() is False
    (record,) = caplog.records
    assert "node and npm not on PATH" in record.getMessage() and record.exc_info is None


def test_node_connection_strings() -> None:
    socket = "postgresql+asyncpg://postgres@/jobqueue_bench_x?host=/work/run"
    assert graphile.node_conninfo(socket) == (
        "postgresql://postgres@/jobqueue_bench_x?host=%2Fwork%2Frun")
    tcp = "postgresql+asyncpg://bob:p%40ss@db.example:6543/q"
    assert graphile.node_conninfo(tcp) == "postgresql://bob:p%40ss@db.example:6543/q"


def test_node_versions_are_read_from_the_machine(graphile_installed: None) -> None:
    assert (graphile.node_version() or "").startswith("v")
    assert (graphile.declared_node() or "").startswith(">=")


def test_settings_name_the_knobs_and_perftest() -> None:
    assert graphile.settings(4, 24) == "concurrency 24, 4 processes, perfTest configuration"
    assert graphile.settings(1, 8) == "concurrency 8, 1 process, perfTest's other options"
