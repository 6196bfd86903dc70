"""The bench driver (`python -m jobqueue.benchmarks.run`, what `make bench`
runs): it executes a notebook in a real kernel, hears its series' steps,
says on the terminal where it is, and stamps the results with its run."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from jobqueue.benchmarks import COMMIT_ENV, PROGRESS_ENV, RUN_ENV, load, run, save

CELLS = [
    nbformat.v4.new_markdown_cell("# A demo\n\n## The series"),
    nbformat.v4.new_code_cell("from jobqueue.benchmarks.scenarios import progress\n"
                              "with progress(3, 'demo') as bar:\n"
                              "    for _ in range(3):\n"
                              "        bar.update()\n"
                              "print('ran', bar.done)"),
    nbformat.v4.new_markdown_cell("## After"),
    nbformat.v4.new_code_cell("1 + 1"),
]


def test_a_notebook_runs_in_place_with_its_progress_heard_not_drawn(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nb = nbformat.v4.new_notebook(cells=CELLS)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, tmp_path / "demo.ipynb")
    steps_file = tmp_path / "steps.jsonl"
    monkeypatch.setenv(PROGRESS_ENV, str(steps_file))
    ticker = run.Ticker(steps_file, remaining_after=0.0)
    labels: list[str] = []
    monkeypatch.setattr(ticker, "show", lambda force=False: labels.append(ticker.line()))

    run.execute("demo", ticker, after=0.0, folder=tmp_path)

    done = nbformat.read(tmp_path / "demo.ipynb", as_version=4)
    outputs = done.cells[1].outputs
    assert [o.get("text") for o in outputs] == ["ran 3\n"]  # no progress bar on stderr
    assert all(run.cell_seconds(c) is not None for c in done.cells if c.cell_type == "code")
    assert any("demo cell 1/2 · The series" in label for label in labels)
    assert any("demo cell 2/2 · After" in label for label in labels)
    lines = [json.loads(line) for line in steps_file.read_text().splitlines()]
    assert [line["done"] for line in lines] == [0, 1, 2, 3]
    assert run.last_step(steps_file)["total"] == 3


def test_a_failed_cell_names_the_notebook(tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("raise ValueError('boom')")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, tmp_path / "bad.ipynb")
    before = (tmp_path / "bad.ipynb").read_text()
    with pytest.raises(RuntimeError, match=r"(?s)bad\.ipynb: .*boom"):
        run.execute("bad", run.Ticker(tmp_path / "none.jsonl", 0.0), after=0.0, folder=tmp_path)
    assert (tmp_path / "bad.ipynb").read_text() == before  # not half-written


def test_an_unknown_notebook_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        run.main(["throughput", "nope"])
    assert exit_.value.code == 2
    assert "no benchmark notebook nope" in capsys.readouterr().err


def test_results_carry_the_run_that_wrote_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RUN_ENV, "2026-12-01T10:00:00+00:00")
    monkeypatch.setenv(COMMIT_ENV, "abc123")
    save([{"x": 1}], "test_run_stamp", {"cpu": "test"})
    df, context = load("test_run_stamp")
    assert (context["run"], context["commit"], context["cpu"]) == (
        "2026-12-01T10:00:00+00:00", "abc123", "test")
    assert df["x"].tolist() == [1]


def test_a_notebook_run_by_hand_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RUN_ENV, raising=False)
    monkeypatch.delenv(COMMIT_ENV, raising=False)
    save([{"x": 1}], "test_run_stamp", {})
    _, context = load("test_run_stamp")
    assert context["run"] == "by hand"
    assert context["commit"] and context["commit"] != "unknown"


def test_a_partial_rerun_keeps_the_full_run_and_adds_itself() -> None:
    full = run._record({}, "T1", "c1", True, list(run.BENCH_NOTEBOOKS), {"throughput": 5.0})
    again = run._record(full, "T2", "c2", False, ["comparison"], {"comparison": 3.0})
    assert (again["started"], again["commit"], again["steps"]) == ("T1", "c1", {"throughput": 5.0})
    assert again["reruns"] == [{"started": "T2", "commit": "c2", "notebooks": ["comparison"]}]
    # a later rerun of a notebook takes it off the earlier one's list
    third = run._record(run._record(again, "T3", "c3", False, ["scale", "latency"], {}),
                        "T4", "c4", False, ["comparison", "scale"], {})
    assert [(r["started"], r["notebooks"]) for r in third["reruns"]] == [
        ("T3", ["latency"]), ("T4", ["comparison", "scale"])]


def test_a_run_records_the_parameters_it_took_from_the_environment(tmp_path: Path) -> None:
    from jobqueue.benchmarks import report

    given = run.overrides({"JOBQUEUE_BENCH_PRESSURE_PHASES": '[{"name": "baseline"}]',
                           RUN_ENV: "T1", COMMIT_ENV: "c1", "JOBQUEUE_LAB_SIZE": "full",
                           "JOBQUEUE_BENCH_PROGRESS": "/tmp/p"})
    assert given == {"JOBQUEUE_BENCH_PRESSURE_PHASES": '[{"name": "baseline"}]'}
    full = run._record({}, "T1", "c1", True, ["pressure"], {"pressure": 5.0}, given)
    again = run._record(full, "T2", "c2", False, ["latency"], {}, {"JOBQUEUE_BENCH_N": "9"})
    header = report._header(tmp_path, again, {})
    assert ("in all (pressure 0 min 05 s); every results file" in header
            and "It set, over the notebooks' full size: "
                "`JOBQUEUE_BENCH_PRESSURE_PHASES=[{\"name\": \"baseline\"}]`." in header)
    assert header.endswith("latency (marked in its sections). It set, over the notebooks' "
                           "full size: `JOBQUEUE_BENCH_N=9`. Do not edit by hand: rerun "
                           "`make bench` on your machine to get your own.")
    plain = report._header(tmp_path, run._record({}, "T1", "c1", True, [], {}, {}), {})
    assert "It set" not in plain


def test_each_section_says_which_run_it_comes_from(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from jobqueue.benchmarks import report

    monkeypatch.setattr("jobqueue.benchmarks.results_dir", lambda: tmp_path)
    monkeypatch.setenv(COMMIT_ENV, "abc123")
    for name, started in (("latency", "T1"), ("latency_samples", "T1"), ("recovery", "T1"),
                          ("recovery_timeline", "T2")):
        monkeypatch.setenv(RUN_ENV, started)
        save([{"x": 1}], name, {})
    record = run._record({}, "T1", "abc123", True, list(run.BENCH_NOTEBOOKS),
                         {"latency": 61.0, "recovery": 125.0})
    assert report.stamp(tmp_path, "latency", record) == (
        "*From the run above (started T1, commit `abc123`).*")
    mixed = report.stamp(tmp_path, "recovery", record)
    assert mixed.startswith("**Not from the run above**")
    assert "run T2 at commit `abc123` (recovery_timeline.csv)" in mixed
    assert "another machine" not in report.stamp(tmp_path, "recovery", record, cpu="?")
    monkeypatch.setenv(RUN_ENV, "T2")
    save([{"x": 1}], "recovery_timeline", {"cpu": "Other CPU"})
    moved = report.stamp(tmp_path, "recovery", record, cpu="Test CPU")
    assert "run T2 at commit `abc123` on another machine (Other CPU) (recovery_timeline.csv)" \
        in moved
    assert "run T1 at commit `abc123` (recovery.csv)" in moved  # no machine recorded
    header = report._header(tmp_path, run._record(record, "T3", "def456", False,
                                                  ["recovery"], {}), {})
    assert "started T1 at commit `abc123`, 3 min 06 s in all (latency 1 min 01 s" in header
    assert "**Partial rerun** started T3 at commit `def456`: recovery" in header
