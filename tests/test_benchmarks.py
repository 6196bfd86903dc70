"""The benchmark lab's scenarios and report, at toy size."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import pytest

from jobqueue.benchmarks import ceiling, load, param, save, scenarios
from jobqueue.benchmarks.report import render


@pytest.fixture
async def bench_url(server_url: str):
    name = f"t{uuid.uuid4().hex[:8]}"
    url = await scenarios.open_bench(name)
    yield url
    await scenarios.close_bench(name)


def test_params_come_from_one_place(monkeypatch) -> None:
    monkeypatch.delenv("JOBQUEUE_LAB_SIZE", raising=False)
    assert param("x", smoke=1, full=2) == 1
    monkeypatch.setenv("JOBQUEUE_LAB_SIZE", "full")
    assert param("x", smoke=1, full=2) == 2
    monkeypatch.setenv("JOBQUEUE_BENCH_X", "[3, 4]")
    assert param("x", smoke=1, full=2) == [3, 4]


async def test_drain_modes_and_handlers(bench_url: str) -> None:
    exclusive = await scenarios.drain(bench_url, n=300, batch_size=50, workers=2, shared=False)
    shared = await scenarios.drain(bench_url, n=300, batch_size=50, workers=2, shared=True,
                                   handler="write_row")
    assert exclusive["workers_used"] == 1  # the second process only stood by
    assert shared["workers_used"] >= 1 and shared["handler"] == "write_row"
    for run in (exclusive, shared):
        assert run["jobs_per_sec"] > 0 and run["seconds"] > 0
        assert run["wal_mib"] > 0 and run["checkpoints"] >= 0 and run["full_page_images"] >= 0


def test_the_report_names_a_checkpoint_only_the_biggest_drain_spans() -> None:
    import pandas as pd

    from jobqueue.benchmarks.report import _checkpoint_sentence

    sizes = pd.DataFrame({"n": [10_000, 1_000_000], "wal_mib": [6.0, 700.0],
                          "full_page_images": [7, 15_690], "checkpoints": [0, 1]})
    sentence = _checkpoint_sentence(sizes, 1_000_000)
    assert "1,000,000 jobs writes 700 MiB" in sentence and "15,690 full-page images" in sentence
    assert _checkpoint_sentence(sizes.assign(checkpoints=[1, 1]), 1_000_000) == ""
    assert _checkpoint_sentence(sizes.drop(columns="checkpoints"), 1_000_000) == ""


async def test_open_loop_keeps_its_schedule(bench_url: str) -> None:
    result = await scenarios.open_loop(bench_url, rate=40, seconds=0.5)
    summary = result["summary"]
    assert summary["jobs"] == 20 and len(result["to_complete"]) == 20
    assert 0 < summary["start_p50_ms"] <= summary["complete_p50_ms"]
    assert summary["complete_p50_ms"] <= summary["complete_p99_ms"] <= summary["complete_p99_9_ms"]
    assert summary["achieved_rate"] == pytest.approx(40, rel=0.25)


async def test_report_renders_from_results_files(bench_url: str, tmp_path: Path,
                                                 monkeypatch) -> None:
    monkeypatch.setattr("jobqueue.benchmarks.results_dir", lambda: tmp_path)
    context = await scenarios.environment(bench_url)
    matrix = await scenarios.drain_matrix(bench_url, n=100, batch_sizes=[10, 50], workers=[1],
                                          modes=["exclusive"], repeat=1)
    save(matrix, "throughput_matrix", context)
    summaries, samples = await scenarios.latency_series(bench_url, rates=[40], seconds=0.25,
                                                        repeat=1)
    save(summaries, "latency", context)
    save(samples, "latency_samples", context)
    times, timeline = await scenarios.recovery_series(bench_url, signals=["SIGKILL"], trials=1,
                                                      lease=1.0, jobs=300)
    save(times, "recovery", context)
    save(timeline, "recovery_timeline", context)
    soak = await scenarios.soak(bench_url, rate=100, seconds=1.0, keep_seconds=1, interval=0.2)
    save([soak["summary"]], "throughput_soak", context)
    save(soak["timeline"], "throughput_soak_timeline", context)
    df, ctx = load("throughput_matrix", tmp_path)
    assert len(df) == 2 and ctx["fsync"] == "on"

    out = render(tmp_path, tmp_path / "BENCHMARKS.md")
    text = out.read_text()
    for heading in ("## Setup", "## Throughput", "## Latency", "## Dead-worker recovery",
                    "Celery + Redis"):
        assert heading in text
    assert "| SIGKILL |" in text
    assert "### A long run" in text and (tmp_path / "soak.png").stat().st_size > 0
    assert (tmp_path / "throughput.png").stat().st_size > 0
    assert signal.SIGKILL.name in set(times_df_signals(tmp_path))


def times_df_signals(path: Path) -> list[str]:
    df, _ = load("recovery", path)
    return list(df["signal"])


async def test_a_soak_samples_the_table_and_the_worker(bench_url: str) -> None:
    run = await scenarios.soak(bench_url, rate=200, seconds=1.5, keep_seconds=1, interval=0.1)
    points = run["timeline"]
    assert len(points) >= 10
    assert points[-1]["live"] + points[-1]["backlog"] > 0 or points[-1]["table_mib"] > 0
    assert all(p["rss_mib"] is None or 20 < p["rss_mib"] < 500 for p in points)
    assert run["summary"]["jobs"] == 300 and run["summary"]["rss_mib_start"] is not None


async def test_the_course_design_drains_everything(bench_url: str) -> None:
    rows = await scenarios.course_drains(bench_url, n=50, repeat=1)
    assert rows[0]["processed"] == 50 and rows[0]["jobs_per_sec"] > 0


async def test_the_ceiling_measures_every_row(server_url: str) -> None:
    rows = await ceiling.run(n=30, repeat=2, batch=20, noop_jobs=100,
                             name=f"t{uuid.uuid4().hex[:8]}")
    names = [r["name"] for r in rows]
    assert names[:2] == ["round trip", "INSERT"] and "lane session, plain" in names
    assert "session per job (create_savepoint)" in names and names[-1].startswith("take")
    for row in rows:
        assert row["wall_us"] > 0 and row["client_cpu_us"] > 0 and row["jobs_per_sec"] > 0
        assert row["n"] in (30, 100) and row["repeat"] == 2
    assert "lane session, isolated" in ceiling.table(rows)
