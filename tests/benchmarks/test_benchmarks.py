"""The benchmark lab's scenarios and report, at toy size."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import pytest

from jobqueue.benchmarks import (
    ceiling,
    load,
    param,
    peers,
    plots,
    recovery,
    report,
    save,
    scenarios,
)
from jobqueue.benchmarks.report import render
from jobqueue.worker import DEFAULT_BATCH_SIZE, DEFAULT_CONCURRENCY


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
    # The headline table opens the document: the three drains, each peer's best.
    glance = text[text.index("## At a glance"):text.index("## Setup")]
    assert glance.count("| drain, ") == 9 and "| 5.00 |" in glance  # 32,000 ÷ 6,400
    assert text.count(report.note("per_job_commits")) == 1  # under the no-op drains only
    assert "| graphile-worker | concurrency 24, 4 processes, perfTest configuration | 4 |" in text
    for figure in ("comparison_drain", "comparison_write_row", "comparison_process_payment"):
        assert (tmp_path / f"{figure}.png").stat().st_size > 0


@pytest.mark.serial  # it measures a schedule: another test's load beside it skews the clock
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
                                          modes=["exclusive"], repeat=1, seconds=0.05,
                                          min_seconds=0)
    save(matrix, "throughput_matrix", context)
    summaries, samples = await scenarios.latency_series(bench_url, rates=[40], seconds=0.5,
                                                        repeat=1, warmup=0.1)
    save(summaries, "latency", context)
    save(samples, "latency_samples", context)
    times, timeline = await recovery.recovery_series(bench_url, signals=["SIGKILL"], trials=1,
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
    # BENCHMARKS.md's section, from the saved rows.
    path = save(rows, "ceiling", {"event_loop": "uvloop"})
    path.rename(tmp_path / path.name)
    text = render(tmp_path, tmp_path / "BENCHMARKS.md").read_text()
    section = text.split("## Where a job's time goes", 1)[1]
    plain = next(r for r in rows if r["name"] == "lane session, plain")
    assert f"| lane session, plain | {plain['what']} | {plain['wall_us']:,.1f} |" in section
    assert "| lane session, isolated |" in section and "event loop: uvloop" in section


# -- drains long enough to measure, workers that took part, flags ------------------


@pytest.mark.serial  # "40 jobs drain in well under 0.25 s" needs the machine to itself
async def test_drains_are_sized_to_last_and_short_ones_run_again(bench_url: str) -> None:
    rows = await scenarios.drain_matrix(bench_url, n=40, batch_sizes=[10], workers=[1],
                                        modes=["exclusive"], repeat=1, seconds=0.5,
                                        min_seconds=0.25)
    sizing = [r for r in rows if not r["counted"]]
    kept = [r for r in rows if r["counted"]]
    assert sizing, "40 jobs at batch 10 drain in well under 0.25 s: a sizing run was expected"
    assert all(r["seconds"] < 0.25 and r["run"] == 0 for r in sizing)
    assert len(kept) == 1 and kept[0]["run"] == 1 and kept[0]["n"] > sizing[0]["n"]
    assert kept[0]["seconds"] >= 0.25 or len(sizing) == scenarios._MAX_SIZING_RUNS
    assert kept[0]["workers_used"] == 1 and kept[0]["start_skew_s"] == 0
    assert scenarios.sized_n(37_412.0, 1.5) == 57_000 and scenarios.sized_n(3.0, 1.0) == 100
    # The figures use the counted drain only.
    import pandas as pd

    table = plots.throughput_table(pd.DataFrame(rows))
    assert table["runs"].tolist() == [1] and table["jobs per drain"].tolist() == [
        f"{kept[0]['n']:,}"]


def _matrix(cells: dict[tuple[str, int, int], list[tuple[float, int, float]]]):
    """Matrix rows: (mode, workers, batch) -> [(jobs/s, workers_used, seconds)]."""
    import pandas as pd

    return pd.DataFrame([{"mode": m, "workers": w, "batch_size": b, "n": round(r * s),
                          "seconds": s, "jobs_per_sec": r, "workers_used": u, "run": i,
                          "counted": True, "handler": "noop"}
                         for (m, w, b), runs in cells.items()
                         for i, (r, u, s) in enumerate(runs, 1)])


def test_no_best_claim_from_a_run_where_a_worker_sat_out() -> None:
    df = _matrix({
        ("exclusive", 1, 1): [(900, 1, 2.0), (880, 1, 2.1), (910, 1, 2.0)],
        ("exclusive", 2, 1): [(600, 1, 2.5), (580, 1, 2.6), (615, 1, 2.4)],
        ("exclusive", 1, 1000): [(30_000, 1, 1.5), (31_000, 1, 1.4), (29_000, 1, 1.6)],
        ("shared", 1, 1000): [(32_000, 1, 1.5), (33_000, 1, 1.4), (31_000, 1, 1.6)],
        # The fastest median, but in one run only one of the two workers took jobs.
        ("shared", 2, 1000): [(67_745, 1, 1.2), (40_000, 2, 1.5), (41_000, 2, 1.5)],
        ("shared", 2, 1): [(1_400, 2, 0.8), (1_300, 2, 1.1), (1_350, 2, 1.2)],
    })
    table = plots.throughput_table(df).set_index(["mode", "workers", "batch size"])
    assert "not every worker took part (1 of 3 runs)" in table.loc[("shared", 2, 1000), "flags"]
    assert table.loc[("shared", 2, 1000), "workers used"] == "1–2"
    assert "drain under 1 s (1 of 3)" in table.loc[("shared", 2, 1), "flags"]
    assert table.loc[("exclusive", 2, 1), "flags"] == ""  # one active worker is the design
    # Every worker took part, but the second joined a third into the drain.
    late = _matrix({("shared", 2, 100): [(20_000, 2, 1.5)]}).assign(start_skew_s=0.5)
    assert "a worker joined after 10% of the drain (1 of 1 runs)" in plots.throughput_table(
        late)["flags"].iloc[0]
    assert plots.BEST_FLAG not in " ".join(plots.throughput_table(late)["flags"])
    assert plots.BEST_FLAG in plots.throughput_table(late.assign(start_skew_s=0.05))["flags"][0]
    # The fastest median is flagged: the best is the fastest setting without a flag.
    best = table[table["flags"].str.contains(plots.BEST_FLAG)]
    assert list(best.index) == [("shared", 1, 1000)]


async def test_a_drain_reports_the_workers_that_took_part(bench_url: str) -> None:
    row = await scenarios.drain(bench_url, n=2_000, batch_size=20, workers=2, shared=True)
    assert row["workers_used"] in (1, 2) and row["start_skew_s"] >= 0
    assert row["autovacuums"] >= 0
    flagged = "not every worker took part" in plots.throughput_table(
        _matrix({("shared", 2, 20): [(row["jobs_per_sec"], row["workers_used"],
                                      row["seconds"])]}))["flags"].iloc[0]
    assert flagged == (row["workers_used"] < 2)


def test_the_soak_is_flagged_where_it_climbs() -> None:
    import pandas as pd

    summary = {"rate": 1000, "seconds": 120, "keep_seconds": 30, "dead_peak_middle": 63_654.0,
               "dead_peak_last": 72_695.0, "live_peak_last": 30_000.0, "table_mib_middle": 11.0,
               "table_mib_end": 11.4, "autovacuums": 13, "rss_mib_start": 54.8,
               "rss_mib_end": 54.9}
    healthy = plots.soak_table(pd.DataFrame([summary]))
    assert healthy["flags"].iloc[0] == ""  # 72,695 is under 1.5 × 63,654: a saw-tooth
    climbing = plots.soak_table(pd.DataFrame([{**summary, "dead_peak_last": 120_000.0,
                                               "table_mib_end": 20.0, "rss_mib_end": 80.0}]))
    assert climbing["flags"].iloc[0] == ("⚠ dead rows still climbing; ⚠ table still growing; "
                                         "⚠ worker RSS grew over 10 %")


def _latency(rate: float, achieved: float, per_run: int, runs: int = 3):
    import pandas as pd

    summaries = pd.DataFrame([{"rate": rate, "achieved_rate": achieved, "warmup_s": 1.0,
                               "jobs_per_commit": 1.0, "run": r} for r in range(runs)])
    samples = pd.DataFrame([{"rate": rate, "run": r, "to_start_ms": 1.0 + i % 10 / 10,
                             "to_complete_ms": 2.0 + i % 10 / 10, "warmup": i == 0}
                            for r in range(runs) for i in range(per_run)])
    samples.loc[samples["warmup"], ["to_start_ms", "to_complete_ms"]] = 15.5  # cold start
    return summaries, samples


def test_percentiles_only_where_the_samples_carry_them() -> None:
    import pandas as pd

    low = _latency(10, 10.0, per_run=41)          # 3 × 40 counted: p99 yes, p99.9 no
    high = _latency(1000, 1000.0, per_run=401)    # 3 × 400 counted: both
    unmet = _latency(2000, 1_558.0, per_run=401)  # the producer fell short
    df = pd.concat([low[0], high[0], unmet[0]])
    samples = pd.concat([low[1], high[1], unmet[1]])
    assert plots.min_samples(0.99) == 100 and plots.min_samples(0.999) == 1000
    st = plots.latency_stats(df, samples).set_index("rate")
    assert st.loc[10, "samples"] == 120 and st.loc[1000, "samples"] == 1200
    assert pd.isna(st.loc[10, "complete_p99_9_ms"]) and st.loc[10, "complete_p99_ms"] < 15
    assert not pd.isna(st.loc[1000, "complete_p99_9_ms"])
    assert samples["to_complete_ms"].max() == 15.5  # only the warm-up was that slow ...
    assert st["complete_p99_9_ms"].max() < 15.5     # ... and it is left out
    assert bool(st.loc[1000, "met"]) and not bool(st.loc[2000, "met"])
    table = plots.latency_table(df, samples).set_index("arrivals (jobs/s)")
    assert table.loc[10, "to completion p99.9 (ms)"] == "–"
    assert table.loc[2000, "achieved (jobs/s)"] == "1,558 ⚠ under 95%"
    fig = plots.latency_plot(df, samples)
    assert sorted(fig.axes[0].lines[0].get_xdata()) == [10.0, 1000.0, 1558.0]
    assert table["warm-up left out (s)"].tolist() == ["1", "1", "1"]


@pytest.mark.serial  # it measures a schedule: another test's load beside it skews the clock
async def test_open_loop_marks_its_warm_up(bench_url: str) -> None:
    result = await scenarios.open_loop(bench_url, rate=40, seconds=1.0, warmup=0.3)
    summary, warm = result["summary"], result["warmup"]
    assert len(warm) == 40 and 10 <= sum(warm) <= 14  # the jobs of the first 0.3 s
    assert warm[0] and not warm[-1] and summary["samples"] == 40 - sum(warm)
    assert summary["warmup_s"] == 0.3 and summary["jobs_per_commit"] >= 1


def test_the_scale_section_renders_from_its_files_and_says_which_run(tmp_path: Path) -> None:
    context = {"cpu": "test", "run": "R1", "commit": "c1"}
    for name, rows in (
            ("scale_build", [{"finished": 1000, "waiting": 100, "build_s": 1.0,
                              "total_mib": 3.0, "heap_mib": 2.0, "indexes_mib": 1.0,
                              "jobs": 1100}]),
            ("scale_reads", [
                {"read": "GET /metrics", "ms": 2254.4, "answer": "200; estimated: completed",
                 "finished in": "jobs"},
                {"read": "GET /metrics", "ms": 101.5, "answer": "200", "finished in": "history"}]),
            ("scale_retention", [
                {"how": "rows deleted (before 0012)", "rows": 100, "rows_per_sec": 16_000.0},
                {"how": "days dropped (0012)", "rows": 900, "rows_per_sec": 2_000_000.0}]),
            ("scale_sizes", [{"when": "after the move", "jobs": 100, "history_mib": 7.0}]),
            ("scale_drains", [
                {"n": 50, "flags": "(defaults)", "jobs_per_sec": 1000.0, "autovacuums": 0,
                 "run": 1, "table": "nothing else", "÷ empty": None},
                {"n": 50, "flags": "(defaults)", "jobs_per_sec": 800.0, "autovacuums": 1,
                 "run": 1, "table": "built above", "÷ empty": 0.8}]),
            ("scale_migration", [{"from": "0005", "to": "0010", "seconds": 7.9, "retries": 0,
                                  "errors": None}])):
        path = save(rows, name, context)
        path.rename(tmp_path / path.name)
    text = render(tmp_path, tmp_path / "BENCHMARKS.md").read_text()
    section = text[text.index("## At scale"):]
    assert "**Not from the run above**: run" in section  # no run record: its own stamp
    assert "1,000 finished jobs and 100 waiting" in section
    assert "| read | ms, finished in jobs | ms, finished in history | answer (last) |" in section
    assert "| GET /metrics | 2,254.4 | 101.5 | 200 |" in section
    assert "| days dropped (0012) | 900 | 2,000,000.0 |" in section
    assert report.note("scale_history") in section
    assert "| built above | (defaults) | 800 | 0.80 | 1 | 1 |" in section
    assert "| 0005 | 0010 |" in section
    assert report.note("scale_drains") in section
