"""`make bench`: the benchmark notebooks at full size, the per-job cost
table, then BENCHMARKS.md and the README's performance summary, as one run
with one stamp (`run_stamp`; `run.json` beside the results).

    python -m jobqueue.benchmarks.run                 # what `make bench` runs
    python -m jobqueue.benchmarks.run comparison      # one notebook again: a partial rerun
    python -m jobqueue.benchmarks.run pressure        # what `make bench-pressure` runs
    python -m jobqueue.benchmarks.run scale           # what `make bench-scale` runs

The pressure notebook takes most of an hour, and the scale notebook builds a
table of ten million jobs, so each is a command of its own.
Nothing a notebook draws reaches a terminal, so this driver says where the
run is (notebook, section, the step of a series from `scenarios.progress`)
and estimates the time left from the committed notebooks' cell timings and
the last run's steps.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jobqueue.benchmarks import (
    COMMIT_ENV,
    PARAM_PREFIX,
    PROGRESS_ENV,
    RUN_ENV,
    checkout_commit,
    run_record,
)

CHECKOUT = Path(__file__).resolve().parents[2]
NOTEBOOKS = CHECKOUT / "notebooks" / "benchmarks"
RESULTS = NOTEBOOKS / "results"
#: Every benchmark notebook, in the order they run.
BENCH_NOTEBOOKS = ("throughput", "latency", "recovery", "comparison", "pressure", "scale")
#: The notebooks of `make bench` (a full run): all but the long pressure run
#: and the scale run (its table of ten million jobs takes a quarter of an hour
#: to build).
FULL_RUN = ("throughput", "latency", "recovery", "comparison")
#: The steps after the notebooks, as this driver runs them.
AFTER = {"ceiling": [sys.executable, "-m", "jobqueue.benchmarks.ceiling", "--save"],
         "report": [sys.executable, "-m", "jobqueue.benchmarks.report"],
         "readme": [sys.executable, "-m", "jobqueue.benchmarks.readme"]}
#: Seconds between lines when stdout is not a terminal and nothing changed;
#: a terminal gets its one line rewritten every second.
QUIET_TICK = 30.0


def _clock(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


def cell_seconds(cell: dict[str, Any]) -> float | None:
    """How long a code cell took when the notebook last ran."""
    timing = cell.get("metadata", {}).get("execution", {})
    start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
    if not (start and end):
        return None
    parse = datetime.fromisoformat
    return (parse(end.replace("Z", "+00:00")) - parse(start.replace("Z", "+00:00"))
            ).total_seconds()


def headings(cells: Sequence[dict[str, Any]]) -> list[str]:
    """For each cell, the last Markdown heading at or before it."""
    current, out = "", []
    for cell in cells:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                if line.startswith("#"):
                    current = line.lstrip("#").strip()
        out.append(current)
    return out


def last_step(path: Path) -> dict[str, Any] | None:
    """The latest step a series wrote to `path`, None before the first."""
    try:
        lines = path.read_text(errors="replace").splitlines()[-2:]  # the last may be half-written
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        try:
            return json.loads(line)  # type: ignore[no-any-return]
        except json.JSONDecodeError:
            continue
    return None


class Ticker:
    """The run's line on the terminal, from a thread while a cell executes;
    `remaining_after`: the estimate for everything after the cell."""

    cell_expected: float | None

    def __init__(self, progress_file: Path, remaining_after: float) -> None:
        self.progress_file, self.remaining_after = progress_file, remaining_after
        self.tty = sys.stdout.isatty()
        self.started = self.cell_started = time.monotonic()
        self.label, self.cell_expected = "starting", None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._printed, self._printed_at = "", 0.0

    def cell(self, label: str, expected: float | None, remaining_after: float) -> None:
        self.label, self.cell_expected, self.remaining_after = label, expected, remaining_after
        self.cell_started = time.monotonic()
        self.show(force=True)

    def line(self) -> str:
        now = time.monotonic()
        in_cell = now - self.cell_started
        step, here = last_step(self.progress_file), ""
        cell_left = None if self.cell_expected is None else max(0.0, self.cell_expected - in_cell)
        if step and step["t"] >= time.time() - in_cell - 1:  # a step of this cell's
            done, total = int(step["done"]), int(step["total"])
            here = f" · {step['desc']} {done}/{total}"
            if 0 < done < total:
                cell_left = (step["t"] - step["started"]) / done * (total - done)
        if cell_left is None:  # a cell that has not run at full size before
            left = f"≥{_clock(self.remaining_after)}" if self.remaining_after else "?"
        else:
            left = f"~{_clock(cell_left + self.remaining_after)}"
        return f"[{_clock(now - self.started)} elapsed, {left} left] {self.label}{here}"

    def show(self, force: bool = False) -> None:
        text, now = self.line(), time.monotonic()
        if self.tty:
            sys.stdout.write("\r\033[K" + text)
        elif force or (now - self._printed_at >= QUIET_TICK and text != self._printed):
            sys.stdout.write(text + "\n")
        else:
            return
        sys.stdout.flush()
        self._printed, self._printed_at = text, now

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            self.show()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.tty:
            sys.stdout.write("\n")


def execute(name: str, ticker: Ticker, after: float, folder: Path = NOTEBOOKS) -> None:
    """Run one notebook in place, telling `ticker` which cell runs; the
    kernel's stderr is shown only if a cell fails."""
    import nbformat
    from nbclient import NotebookClient

    path = folder / f"{name}.ipynb"
    nb = nbformat.read(path, as_version=4)
    durations = [cell_seconds(c) if c["cell_type"] == "code" else 0.0 for c in nb.cells]
    sections = headings(nb.cells)
    code = [i for i, c in enumerate(nb.cells) if c["cell_type"] == "code"]

    def on_cell_execute(cell: Any, cell_index: int) -> None:
        later = sum(d or 0.0 for d in durations[cell_index + 1:])
        number = code.index(cell_index) + 1 if cell_index in code else 0
        label = f"{name} cell {number}/{len(code)}"
        if sections[cell_index]:
            label += f" · {sections[cell_index]}"
        ticker.cell(label, durations[cell_index], later + after)

    client = NotebookClient(nb, timeout=3600, kernel_name="python3",
                            resources={"metadata": {"path": str(folder)}},
                            on_cell_execute=on_cell_execute)
    with tempfile.TemporaryFile("w+") as kernel_log:
        try:
            client.execute(stderr=kernel_log)
        except Exception as exc:
            kernel_log.seek(0)
            raise RuntimeError(f"{name}.ipynb: {exc}\nkernel stderr:\n"
                               f"{kernel_log.read()[-2000:]}") from exc
    nbformat.write(nb, path)


def _record(previous: dict[str, Any], started: str, commit: str, full: bool,
            names: Sequence[str], took: dict[str, float],
            given: dict[str, str] | None = None) -> dict[str, Any]:
    """`run.json`: the last full run (start, commit, each step's time, the
    parameters set from the environment) and the partial reruns since, each
    naming only the notebooks no later rerun ran again."""
    extra = {"overrides": dict(given)} if given else {}
    if full:
        return {"started": started, "commit": commit, "steps": dict(took), "reruns": [],
                **extra}
    rerun = {"started": started, "commit": commit, "notebooks": list(names), **extra}
    # An earlier rerun of the same notebooks no longer stamps any file.
    kept = [{**r, "notebooks": left} for r in previous.get("reruns", [])
            if (left := [n for n in r["notebooks"] if n not in names])]
    return {**previous, "reruns": [*kept, rerun]}


def overrides(environ: dict[str, str]) -> dict[str, str]:
    """The notebook parameters set from the environment (`param`), which the
    document must name: there the run was not the notebooks' full size."""
    own = {RUN_ENV, COMMIT_ENV, PROGRESS_ENV}  # the driver's, not parameters
    return {key: value for key, value in environ.items()
            if key.startswith(PARAM_PREFIX) and key not in own}


def main(argv: Sequence[str] | None = None) -> int:
    import nbformat

    parser = argparse.ArgumentParser(prog="python -m jobqueue.benchmarks.run",
                                     description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", metavar="NOTEBOOK",
                        help=f"only these, a partial rerun ({', '.join(BENCH_NOTEBOOKS)}); "
                             f"default: {', '.join(FULL_RUN)}, then the ceiling table")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.notebooks) - set(BENCH_NOTEBOOKS))
    if unknown:
        parser.error(f"no benchmark notebook {', '.join(unknown)}; "
                     f"one of {', '.join(BENCH_NOTEBOOKS)}")
    names = list(args.notebooks) or list(FULL_RUN)
    full = not args.notebooks
    order = [*names, *(AFTER if full else ["report", "readme"])]

    started = datetime.now(UTC).isoformat(timespec="seconds")
    commit = checkout_commit()
    previous = run_record(RESULTS)
    given = overrides(dict(os.environ))
    estimates = {n: sum(cell_seconds(c) or 0.0 for c in nbformat.read(
        NOTEBOOKS / f"{n}.ipynb", as_version=4).cells) for n in names}
    estimates.update({s: float(previous.get("steps", {}).get(s, 0.0))
                      for s in order if s in AFTER})
    print(f"make bench: {', '.join(order)}; run {started} at commit {commit}; "
          f"about {_clock(sum(estimates.values()))} by the last full run's timings"
          + "".join(f"; {key}={value}" for key, value in sorted(given.items())), flush=True)

    progress_file = Path(tempfile.mkstemp(prefix="jobqueue-bench-", suffix=".jsonl")[1])
    os.environ.update({"JOBQUEUE_LAB_SIZE": "full", RUN_ENV: started, COMMIT_ENV: commit,
                       PROGRESS_ENV: str(progress_file)})
    ticker = Ticker(progress_file, sum(estimates.values()))
    ticker.start()
    took: dict[str, float] = {}
    try:
        for i, step in enumerate(order):
            after = sum(estimates[s] for s in order[i + 1:])
            begun = time.monotonic()
            if step == "report":   # it shows the run's steps: record them first
                (RESULTS / "run.json").write_text(json.dumps(_record(
                    previous, started, commit, full, names, took, given), indent=2) + "\n")
            if step in AFTER:
                ticker.cell(step, estimates[step] or None, after)
                done = subprocess.run(AFTER[step], cwd=CHECKOUT, capture_output=True, text=True)
                if done.returncode != 0:
                    raise RuntimeError(f"{step} failed:\n{done.stdout}{done.stderr}")
            else:
                execute(step, ticker, after)
            took[step] = time.monotonic() - begun
    except Exception as exc:  # a failed cell or step: say which; what ran before stays
        ticker.stop()
        print(f"make bench failed: {str(exc).strip()[-3000:]}", file=sys.stderr)
        return 1
    finally:
        progress_file.unlink(missing_ok=True)
    ticker.stop()
    print("make bench: done in " + _clock(sum(took.values())) + " ("
          + ", ".join(f"{s} {_clock(t)}" for s, t in took.items()) + ")", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
