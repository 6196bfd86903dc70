"""The README's performance summary is rendered from the results files, and
the committed README says what the committed results say."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobqueue.benchmarks import readme, report, save
from tests.benchmarks.test_benchmarks import _rows


def _results(tmp_path: Path, write_row: dict[str, float]) -> Path:
    for name, handler, n, rates in (
            ("comparison_drain", "noop", 50_000,
             {"jobqueue": 32_000, "jobqueue shared": 33_000, "pgqueuer": 6_000,
              "pgqueuer 2": 6_400, "perfTest": 10_000, "graphile 1": 16_000,
              "procrastinate": 250}),
            ("comparison_write_row", "write_row", 20_000, write_row)):
        path = save(_rows(handler, rates, n), name, {"cpu": "test", "cores": "2"})
        path.rename(tmp_path / path.name)
    return tmp_path


def test_the_summary_opens_with_the_headline_table(tmp_path: Path) -> None:
    results = _results(tmp_path, {"jobqueue": 3_000, "graphile 1": 3_300, "pgqueuer": 1_700,
                                  "jobqueue shared": 4_500, "pgqueuer 2": 2_000})
    text = readme.summary(results)
    assert text.startswith(readme.START) and text.endswith(readme.END)
    assert report.LEGEND in text
    rows = [line for line in text.splitlines() if line.startswith("| drain")]
    # jobqueue at its CLI defaults (one process) against each peer's best, any process count.
    assert rows[0].startswith("| drain, noop (jobs/s) | 32,000 | PgQueuer: 6,400 (batch 500, "
                              "2 processes) | 5.00 |"), rows[0]
    assert "| Procrastinate: 250 (concurrency 5, 1 process) | 128.00 | Procrastinate drained "
    assert ("Procrastinate drained 2,500 jobs, jobqueue 50,000" in rows[1]), rows[1]
    assert "graphile-worker: 16,000" in rows[2] and "| 2.00 |" in rows[2]
    # Where a peer is ahead, the lead is under 1 and says so by itself.
    write_row = [r for r in rows if r.startswith("| drain, write_row")]
    assert [r.split(" | ")[3] for r in write_row] == ["1.50", "0.91"], write_row
    assert len(rows) == 5  # three peers ran no-op jobs, two wrote rows: nothing else


def test_the_headline_leads_invert_for_latency(tmp_path: Path) -> None:
    rows = [{"system": system, "settings": label, "rate": 100.0, "run": 1, "jobs": 1000,
             "achieved_rate": 100.0, "completed_rate": 100.0, "rate_met": True, "kept_up": ok,
             "warmup_s": 1.0, "complete_p50_ms": p50, "complete_p99_ms": p99}
            for system, label, p50, p99, ok in (
                ("jobqueue", "CLI defaults", 2.0, 6.0, True),
                ("pgqueuer", "batch 10, 1 process", 3.0, float("nan"), True),
                ("oban-py", "limit 10, 1 process", 5.0, 9.0, False))]
    path = save(rows, "comparison_latency", {"cpu": "test"})
    path.rename(tmp_path / path.name)
    table = report.headline_table(tmp_path)
    leads = dict(zip(table["workload"] + " " + table["peer"].str.split(":").str[0],
                     table[report.LEAD], strict=True))
    assert leads["enqueue → completion p50 at 100 jobs/s (ms) PgQueuer"] == 1.5
    assert leads["enqueue → completion p50 at 100 jobs/s (ms) oban-py"] == 2.5
    assert leads["enqueue → completion p99 at 100 jobs/s (ms) oban-py"] == 1.5
    p99 = table[table["workload"].str.contains("p99") & table["peer"].str.startswith("PgQ")]
    assert p99["flag"].iloc[0] == "the sample does not carry it"
    assert "oban-py: fell behind" in table[table["peer"].str.startswith("oban")]["flag"].iloc[0]


def test_the_block_is_replaced_between_its_markers(tmp_path: Path) -> None:
    page = tmp_path / "README.md"
    page.write_text(f"intro\n\n{readme.START}\nold figures\n{readme.END}\n\nrest\n")
    readme.update(page, f"{readme.START}\nnew\n{readme.END}")
    assert page.read_text() == f"intro\n\n{readme.START}\nnew\n{readme.END}\n\nrest\n"
    page.write_text("no markers\n")
    with pytest.raises(ValueError, match="no performance markers"):
        readme.update(page, "x")
    assert page.read_text() == "no markers\n"


def test_the_committed_readme_says_what_the_committed_results_say() -> None:
    text = readme.README.read_text()
    block = text[text.index(readme.START):text.index(readme.END) + len(readme.END)]
    assert block == readme.summary(report.RESULTS), (
        "README.md's performance block differs from the results files: "
        "run `python -m jobqueue.benchmarks.readme` (make bench does)")


def test_the_pressure_sentence_is_computed_from_the_phases(tmp_path: Path) -> None:
    """Each system's p99 from baseline to its worst pinned phase at the base
    rate (the load phase left out), jobqueue's way back and its tables."""
    import pandas as pd

    def row(system: str, order: int, phase: str, p99: float, pinned: bool,
            load: float | None = None, readers: float | None = None,
            mib: float = 10.0) -> dict[str, object]:
        return {"system": system, "order": order, "phase": phase, "seconds": 100.0,
                "start_s": 100.0 * (order - 1), "end_s": 100.0 * order, "pinned": pinned,
                "load": load, "readers": readers, "rate": 500.0 * (load or 1),
                "complete_p99_ms": p99, "total_mib": mib}

    rows = [row("jobqueue", 1, "baseline", 10.0, False, mib=7.0),
            row("jobqueue", 2, "readers", 25.0, True, readers=4, mib=90.0),
            row("jobqueue", 3, "load", 400.0, True, load=1.5, readers=4, mib=100.0),
            row("jobqueue", 4, "recovery", 11.0, False, mib=95.0),
            row("pgqueuer", 1, "baseline", 600.0, False),
            row("pgqueuer", 2, "readers", 30_000.0, True, readers=4)]
    timeline = pd.DataFrame([{"system": "jobqueue", "t": t, "complete_p99_ms": p99}
                             for t, p99 in ((0, 9.0), (5, 12.0), (300, 50.0), (305, 11.0))])
    for name, frame in (("pressure", pd.DataFrame(rows)), ("pressure_timeline", timeline)):
        path = save(frame.to_dict("records"), name, {"cpu": "test"})
        path.rename(tmp_path / path.name)
    [text] = readme.pressure_lines(tmp_path)
    assert "then also 4 REPEATABLE READ readers, 200 s pinned" in text, text
    assert ("baseline → at its worst pinned phase: jobqueue 10.0 ms → 25.0 ms (2.5×, at "
            "500 jobs/s); PgQueuer 600.0 ms → 30 s (50.0×, at 500 jobs/s)") in text, text
    assert "within its baseline's worst window 10 s after the release" in text, text
    assert "tables grew from 7.0 to 100.0 MiB and were 95.0 MiB at the end" in text, text
    assert readme.pressure_lines(tmp_path / "nothing") == []
