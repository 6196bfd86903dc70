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


def test_the_summary_is_computed_from_the_medians(tmp_path: Path) -> None:
    results = _results(tmp_path, {"jobqueue": 3_000, "graphile 1": 3_300, "pgqueuer": 1_700,
                                  "jobqueue shared": 4_500, "pgqueuer 2": 2_000})
    text = readme.summary(results)
    assert text.startswith(readme.START) and text.endswith(readme.END)
    assert "| jobqueue, 1 process (CLI defaults) | 32,000 | 3,000 |" in text
    assert "| PgQueuer, 2 processes | 6,400 | 2,000 |" in text
    assert "| Procrastinate, 1 process | 250 (2,500 jobs) |  |" in text
    assert "| graphile-worker, 4 processes | 10,000 |  |" in text
    # The one place a peer is ahead, and only that one, is named with its ratio.
    assert ("Where jobqueue is not ahead: jobs that INSERT one row (write_row), 1 process: "
            "graphile-worker 3,300 jobs/s against jobqueue's 3,000 (1.10×).") in text
    assert text.count("jobs/s against jobqueue's") == 1


def test_a_summary_where_jobqueue_leads_says_so(tmp_path: Path) -> None:
    results = _results(tmp_path, {"jobqueue": 3_000, "graphile 1": 2_900, "pgqueuer": 1_700})
    assert "Where jobqueue is not ahead: nowhere in this run" in readme.summary(results)


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
