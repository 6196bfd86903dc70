"""The sync-handler drains of the throughput notebook, at toy size: the same
work as async and as sync handlers, each drained by a real worker at the CLI's
defaults, and the table computed from the rows."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from jobqueue.benchmarks import plots, report, save, scenarios
from jobqueue.worker import DEFAULT_THREADS


async def test_a_sync_series_drains_each_handler_and_checks_its_writes(
        bench_url: str, tmp_path: Path) -> None:
    sync = [setup for setup in scenarios.SYNC_SETUPS if setup[1] == "sync"]
    rows = await scenarios.sync_series(bench_url, n=60, repeat=1, seconds=0.05, min_seconds=0,
                                       setups=sync)
    assert [(r["handler"], r["kind"], r["work"]) for r in rows] == sync
    for row in rows:  # cli_drain checked that each write_row_sync job wrote exactly its row
        assert row["n"] == 60 and row["jobs_per_sec"] > 0 and row["counted"]
        assert row["threads"] == DEFAULT_THREADS
        assert row["argv"] == "--import jobqueue.benchmarks.sync_handlers"

    path = save(rows, "throughput_sync", {"cpu": "test"})
    path.rename(tmp_path / path.name)
    assert report._part(tmp_path, report.PARTS["sync"])[0] == "### Sync handlers beside async ones"
    table = plots.sync_table(pd.read_csv(tmp_path / path.name, comment="#"))
    assert list(table["handler"]) == ["sync (`noop_sync`)", "sync (`write_row_sync`)"]


def _rows(rates: dict[str, list[float]]) -> list[dict]:
    settings = ("CLI defaults, as in the README (`jobqueue worker --import m`): 2 lanes, "
                "batch 1000, INFO logs, 1 process")
    return [{"setup_order": order, "handler": handler, "kind": kind, "work": work,
             "threads": 4, "settings": settings, "mode": "exclusive", "workers": 1,
             "workers_used": 1, "n": 10_000, "seconds": 2.0, "jobs_per_sec": rate,
             "counted": True, "run": run}
            for order, (handler, kind, work) in enumerate(scenarios.SYNC_SETUPS)
            for run, rate in enumerate(rates[handler], 1)]


def test_the_sync_table_gives_each_handler_its_cost_per_job() -> None:
    df = pd.DataFrame(_rows({"noop": [30_000, 32_000, 40_000], "noop_sync": [900, 1_000, 1_100],
                             "write_row": [20_000] * 3, "write_row_sync": [800] * 3}))
    table = plots.sync_table(df).set_index("handler")
    assert table.loc["sync (`noop_sync`)", "jobs/s, median (min–max)"] == "1,000 (900–1,100)"
    assert table["µs per job"].tolist() == [31, 1_000, 50, 1_250]  # 10⁶ ÷ the median
    assert table["threads"].tolist() == ["–", 4, "–", 4]  # sync handlers run in threads
