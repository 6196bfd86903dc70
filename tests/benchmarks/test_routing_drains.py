"""The queues-and-priorities drains of the throughput notebook, at toy size:
jobs spread over queues and priorities, the priority-order check, and the
sentences and table computed from the rows."""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from jobqueue import db
from jobqueue.benchmarks import plots, report, save, scenarios
from jobqueue.worker import DEFAULT_CONCURRENCY


async def test_jobs_are_spread_evenly_and_interleaved(bench_url: str) -> None:
    conn = await db.connect(bench_url)
    try:
        await scenarios.fill_routed(conn, 120, scenarios.queue_names(4), (-1, 0, 1))
        rows = await conn.fetch("SELECT queue, priority, count(*) AS n FROM jobs"
                                " GROUP BY queue, priority")
        first = await conn.fetch("SELECT queue, priority FROM jobs ORDER BY ctid LIMIT 5")
    finally:
        await conn.close()
    assert {(r["queue"], r["priority"]): r["n"] for r in rows} == {
        (q, p): 10 for q in ("q0", "q1", "q2", "q3") for p in (-1, 0, 1)}
    # Neither a queue nor a priority comes first in the table.
    assert [r["queue"] for r in first] == ["q0", "q1", "q2", "q3", "q0"]
    assert [r["priority"] for r in first] == [-1, -1, -1, -1, 0]


async def test_the_order_check_counts_jobs_completed_after_a_lower_priority(
        bench_url: str) -> None:
    conn = await db.connect(bench_url)
    try:
        # Queue a: priority 1 at t=1 and t=3, priority 0 at t=2 (one job late by
        # 1 s); queue b: both at t=5 (one commit: at once, not late).
        await conn.execute(
            "INSERT INTO jobs (job_type, queue, priority, status, started_at, completed_at)"
            " SELECT 'noop', q, p, 'completed', timestamptz '2026-01-01',"
            "        timestamptz '2026-01-01' + make_interval(secs => s)"
            " FROM (VALUES ('a', 1, 1), ('a', 1, 3), ('a', 0, 2), ('b', 1, 5), ('b', 0, 5))"
            "   AS v(q, p, s)")
        late = await conn.fetchrow(scenarios._PRIORITY_ORDER)
        spans = await conn.fetch(scenarios._SPANS)
        await conn.execute("UPDATE jobs SET completed_at = completed_at - interval '2 s'"
                           " WHERE queue = 'a' AND priority = 1 AND completed_at >"
                           " timestamptz '2026-01-01 00:00:02'")
        in_order = await conn.fetchrow(scenarios._PRIORITY_ORDER)
    finally:
        await conn.close()
    assert (late["late_jobs"], float(late["late_by"])) == (1, 1.0)
    assert [(s["queue"], s["priority"], s["jobs"], float(s["first_s"]), float(s["last_s"]))
            for s in spans] == [("a", 1, 2, 1.0, 3.0), ("a", 0, 1, 2.0, 2.0),
                                ("b", 1, 1, 5.0, 5.0), ("b", 0, 1, 5.0, 5.0)]
    assert (in_order["late_jobs"], float(in_order["late_by"])) == (0, 0.0)


async def test_a_routing_series_runs_every_setup_and_reads_the_order(bench_url: str) -> None:
    rows, spans = await scenarios.routing_series(bench_url, n=200, queues=4, repeat=1,
                                                 priorities=(-1, 0, 1))
    setups = [r["setup"] for r in rows]
    assert setups[:2] == ["1 queue, 1 priority", "4 queues × 3 priorities"]
    assert len(setups) == len(scenarios.routing_setups(4, (-1, 0, 1)))
    base, spread = rows[0], rows[1]
    assert base["queues"] == 1 and base["priorities"] == 1 and base["late_jobs"] == 0
    assert spread["queues"] == 4 and spread["priority_range"] == "-1..1"
    for row in rows:
        assert row["n"] == 200 and row["jobs_per_sec"] > 0 and row["late_jobs"] >= 0
        assert row["settings"].startswith("CLI defaults") == (row["argv"] ==
                                                               "--import jobqueue.benchmarks"
                                                               ".handlers")
    mine = [s for s in spans if s["setup"] == spread["setup"]]
    assert sum(s["jobs"] for s in mine) == 200 and len(mine) == 12
    assert all(0 <= s["first_s"] <= s["last_s"] for s in mine)


def test_the_lanes_per_queue_setup() -> None:
    assert scenarios.lanes_per_queue(["q0", "q1"], 2) == ["--queues", "q0=2,q1=2"]
    names = [s["setup"] for s in scenarios.routing_setups(3)]
    assert "3 queues × 5 priorities, a lane per queue" in names


def test_lanes_are_counted_as_the_worker_runs_them() -> None:
    options = argparse.Namespace
    assert scenarios.lanes(options(concurrency=3, queues=None)) == 3
    assert scenarios.lanes(options(concurrency=None, queues="")) == DEFAULT_CONCURRENCY
    assert scenarios.lanes(options(concurrency=None, queues="a=2,b")) == 3  # b: one lane
    assert scenarios.lanes(options(concurrency=4, queues="a,b")) == 4  # names only: shared


def _routing_rows(late: list[int], rates: dict[str, list[float]]) -> list[dict]:
    """Rows as `routing_series` writes them: three setups, a run per rate."""
    setups = {"1 queue, 1 priority": (1, 1, "0..0", []),
              "10 queues × 5 priorities": (10, 5, "-2..2", []),
              "10 queues × 5 priorities, a lane per queue":
                  (10, 5, "-2..2", scenarios.lanes_per_queue(scenarios.queue_names(10)))}
    rows = []
    for order, (setup, (queues, levels, span, flags)) in enumerate(setups.items()):
        argv = scenarios.worker_argv("noop", *flags)
        for run, rate in enumerate(rates[setup], 1):
            spread = order == 1
            rows.append({"setup": setup, "setup_order": order, "n": 40_000, "workers": 1,
                         "mode": "exclusive", "settings": (
                             scenarios.worker_label(argv) if not flags else
                             f"(`jobqueue worker {' '.join(argv)}`): 10 lanes, batch 1000, "
                             "INFO logs, 1 process"),
                         "argv": " ".join(argv), "seconds": 40_000 / rate,
                         "jobs_per_sec": rate, "workers_used": 1, "start_skew_s": 0.0,
                         "queues": queues, "priorities": levels, "priority_range": span,
                         "late_jobs": late[run - 1] if spread else 0,
                         "late_by_s": 0.012 * (late[run - 1] > 0) if spread else 0.0,
                         "run": run})
    return rows


def test_the_routing_table_follows_the_data(tmp_path: Path) -> None:
    rates = {"1 queue, 1 priority": [24_000, 25_000, 26_000],
             "10 queues × 5 priorities": [20_000, 21_000, 22_000],
             "10 queues × 5 priorities, a lane per queue": [23_000, 25_500, 27_000]}
    df = pd.DataFrame(_routing_rows([800, 0, 1_600], rates))
    table = plots.routing_table(df)
    assert table["jobs/s, median (min–max)"].tolist() == [
        "25,000 (24,000–26,000)", "21,000 (20,000–22,000)", "25,500 (23,000–27,000)"]
    assert table["× the first setup"].tolist() == ["1.00", "0.84", "1.02"]
    assert table["late by at most (ms)"].tolist() == ["0.0", "12.0", "0.0"]
    assert list(table["setup"]) == list(rates)  # in the order they ran
    assert table["completed after a lower priority (median)"].tolist() == [
        "0 (0.0%)", "800 (2.0%)", "0 (0.0%)"]
    assert table["worker"].iloc[2].startswith("--queues q0=1,q1=1,")
    spans = pd.DataFrame([{"setup": s, "run": 3, "queue": q, "priority": p, "jobs": 800,
                           "first_s": 0.1 * (2 - p), "last_s": 0.1 * (3 - p)}
                          for s in rates for q in scenarios.queue_names(10)
                          for p in scenarios.ROUTING_PRIORITIES])
    figure = plots.routing_plot(df, spans)
    assert len([ax for ax in figure.axes if ax.lines]) == 2  # the two spread setups
    for name, rows in (("throughput_routing", df.to_dict("records")),
                       ("throughput_routing_spans", spans.to_dict("records"))):
        path = save(rows, name, {})
        path.rename(tmp_path / path.name)
    section = "\n".join(report._part(tmp_path, report.PARTS["routing"]))
    assert "### Queues and priorities" in section and "![routing]" in section
    assert (tmp_path / "routing.png").stat().st_size > 0
