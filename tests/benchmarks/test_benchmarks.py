"""The benchmark lab's scenarios and report, at toy size."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import pytest

from jobqueue.benchmarks import ceiling, load, param, peers, plots, save, scenarios
from jobqueue.benchmarks.report import drain_findings, goal_lines, render
from jobqueue.worker import DEFAULT_BATCH_SIZE, DEFAULT_CONCURRENCY


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


def test_labels_are_built_from_the_arguments_used() -> None:
    readme = scenarios.worker_argv("noop")
    assert readme == ["--import", "jobqueue.benchmarks.handlers"]
    assert scenarios.worker_label(readme) == (
        "CLI defaults, as in the README (`jobqueue worker --import jobqueue.benchmarks.handlers`): "
        f"{DEFAULT_CONCURRENCY} lanes, batch {DEFAULT_BATCH_SIZE}, INFO logs, 1 process")
    quiet = scenarios.worker_argv("process_payment", "--log-level", "WARNING")
    assert scenarios.worker_label(quiet).startswith(
        "(`jobqueue worker --import jobqueue.lab.examples --log-level WARNING`): ")
    assert "WARNING logs" in scenarios.worker_label(quiet)
    burst = scenarios._worker_args(50, True, 1, "--burst")
    assert scenarios.worker_label(burst, 2).endswith(
        "× 2): 1 lane each, batch 50, WARNING logs, 2 processes (shared)")
    # Figures drop the command line, sentences the "CLI defaults" they say themselves.
    assert plots.short_settings(scenarios.worker_label(readme)).startswith("CLI defaults: ")
    assert plots.short_settings(scenarios.worker_label(quiet)).startswith(
        "--log-level WARNING: ")
    assert plots.plain_settings(scenarios.worker_label(readme)).startswith(
        "`jobqueue worker --import jobqueue.benchmarks.handlers`: ")
    assert plots.short_settings("batch 500, 1 process") == "batch 500, 1 process"


def _rows(handler: str, rates: dict[str, float], n: int) -> list[dict]:
    """Results rows as the comparison writes them, for three rounds at
    0.9, 1 and 1.1 times each setup's rate (so the median is the rate)."""
    setups = {"jobqueue": {"system": "jobqueue", "flags": []},
              "jobqueue shared": {"system": "jobqueue", "flags": ["--shared"], "workers": 2},
              "pgqueuer": {"system": "pgqueuer", "batch_size": 500},
              "pgqueuer 2": {"system": "pgqueuer", "batch_size": 500, "workers": 2},
              "perfTest": {"system": "graphile-worker", "workers": 4},
              "graphile 1": {"system": "graphile-worker", "workers": 1},
              "procrastinate": {"system": "procrastinate", "concurrency": 5, "n": 2_500}}
    rows = []
    for key, rate in rates.items():
        setup = setups[key]
        for run, factor in enumerate((0.9, 1.0, 1.1), 1):
            rows.append({"system": setup["system"], "settings": peers.settings(setup, handler),
                         "preset": peers.preset(setup), "workers": setup.get("workers", 1),
                         "n": setup.get("n", n), "handler": handler, "run": run,
                         "seconds": n / rate, "jobs_per_sec": rate * factor,
                         "rss_peak_mib": 50.0})
    return rows


def test_the_findings_are_computed_from_the_medians() -> None:
    import pandas as pd

    df = pd.DataFrame(_rows("noop", {"jobqueue": 32_000, "jobqueue shared": 33_000,
                                     "pgqueuer": 6_000, "pgqueuer 2": 6_400,
                                     "perfTest": 10_000, "graphile 1": 16_000,
                                     "procrastinate": 250}, 50_000))
    text = "\n".join(drain_findings(df))
    assert ("jobqueue at its CLI defaults "
            "(`jobqueue worker --import jobqueue.benchmarks.handlers`") in text
    assert "32,000 jobs/s): 5.0× PgQueuer's best (batch 500, 2 processes: 6,400 jobs/s)" in text
    assert ("3.2× graphile-worker's perfTest configuration (concurrency 24, 4 processes, "
            "perfTest configuration: 10,000 jobs/s)") in text
    assert "2.0× graphile-worker's best (concurrency 24, 1 process" in text
    assert "128.0× Procrastinate's best (concurrency 5, 1 process: 250 jobs/s, n = 2,500)" in text
    # Like for like: the best of each with the same number of processes.
    assert "With 1 process: jobqueue's best (" in text and "is 2.0× the best other queue" in text
    assert "With 2 processes: jobqueue's best (`jobqueue worker" in text
    assert "is 5.2× the best other queue with 2 processes, PgQueuer (batch 500" in text
    assert "With 4 processes" not in text  # no jobqueue setup had four
    assert text.endswith("16,000 jobs/s): 2.1×.")  # best against best
    goals = "\n".join(goal_lines({"noop": df}))
    assert "at least 3× PgQueuer's best: jobqueue at its CLI defaults (32,000 jobs/s)" in goals
    assert "is 5.00×: met" in goals and "is 3.20×: met" in goals
    slow = pd.DataFrame(_rows("write_row", {"jobqueue": 3_000, "graphile 1": 3_200,
                                            "pgqueuer": 1_700}, 20_000))
    assert "is 0.94×: not met" in "\n".join(goal_lines({"write_row": slow}))
    peers_only = slow[slow["system"] != "jobqueue"]
    assert "not measured in this run" in "\n".join(goal_lines({"process_payment": peers_only}))


def test_the_report_renders_each_workload_from_small_csvs(tmp_path: Path) -> None:
    context = {"cpu": "test", "pgqueuer_version": "1.6.0", "graphile-worker_version": "0.18.0"}
    full = {"jobqueue": 32_000, "jobqueue shared": 33_000, "pgqueuer": 6_000,
            "pgqueuer 2": 6_400, "perfTest": 10_000, "procrastinate": 250}
    for name, handler, n in (("comparison_drain", "noop", 50_000),
                             ("comparison_write_row", "write_row", 20_000),
                             ("comparison_process_payment", "process_payment", 20_000)):
        path = save(_rows(handler, full, n), name, context)
        path.rename(tmp_path / path.name)
    text = render(tmp_path, tmp_path / "BENCHMARKS.md").read_text()
    assert "PgQueuer 1.6.0, graphile-worker 0.18.0" in text
    for heading in ("### Draining 50,000 no-op jobs",
                    "### Draining 20,000 jobs that INSERT one row (write_row)",
                    "### Draining 20,000 process_payment jobs"):
        assert heading in text
    assert text.count("jobqueue at its CLI defaults (") == 3
    assert text.count("Best against best") == 3
    assert "| graphile-worker | concurrency 24, 4 processes, perfTest configuration | 4 |" in text
    for figure in ("comparison_drain", "comparison_write_row", "comparison_process_payment"):
        assert (tmp_path / f"{figure}.png").stat().st_size > 0


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


async def test_the_ceiling_measures_every_row(server_url: str, tmp_path: Path) -> None:
    rows = await ceiling.run(n=30, repeat=2, batch=20, noop_jobs=100,
                             name=f"t{uuid.uuid4().hex[:8]}")
    names = [r["name"] for r in rows]
    assert names[:2] == ["round trip", "INSERT"] and "lane session, plain" in names
    assert "session per job (create_savepoint)" in names and names[-1].startswith("take")
    for row in rows:
        assert row["wall_us"] > 0 and row["client_cpu_us"] > 0 and row["jobs_per_sec"] > 0
        assert row["n"] in (30, 100) and row["repeat"] == 2
    assert "lane session, isolated" in ceiling.table(rows)
    # BENCHMARKS.md's section, from the saved rows: the table and the sentence
    # computed from them.
    path = save(rows, "ceiling", {"event_loop": "uvloop"})
    path.rename(tmp_path / path.name)
    text = render(tmp_path, tmp_path / "BENCHMARKS.md").read_text()
    section = text.split("## Where a job's time goes", 1)[1]
    plain = next(r for r in rows if r["name"] == "lane session, plain")
    assert f"{plain['wall_us']:,.0f} µs through the lane's session" in section
    assert "| lane session, isolated |" in section and "event loop: uvloop" in section
