"""The benchmark lab's machinery: scenarios, parameters, results files.

The notebooks in `notebooks/benchmarks/` call it (so can anyone without
Jupyter, and the tests do at toy size); `save()` writes each measurement's
rows to CSV with the machine's description and the run that wrote them
(`make bench` stamps its start and commit: `run_stamp`), so BENCHMARKS.md,
rendered from those files by `report`, can tell a section from another run.
Sizes come from one place, `param`.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

_CHECKOUT = Path(__file__).resolve().parents[2]
#: `JOBQUEUE_BENCH_<NAME>` sets a notebook parameter (`param`).
PARAM_PREFIX = "JOBQUEUE_BENCH_"
RUN_ENV = f"{PARAM_PREFIX}RUN"
COMMIT_ENV = f"{PARAM_PREFIX}COMMIT"
#: The file a series reports its steps to (`scenarios.progress`), set by the driver.
PROGRESS_ENV = "JOBQUEUE_BENCH_PROGRESS"
#: What a bench run itself rewrites: not a change to the code it measured.
_RUN_OUTPUTS = ("notebooks/benchmarks/", "BENCHMARKS.md")


def size() -> str:
    """`full` for `make bench`, `smoke` otherwise (CI, a first look)."""
    return "full" if os.environ.get("JOBQUEUE_LAB_SIZE", "smoke").lower() == "full" else "smoke"


def param(name: str, *, smoke: T, full: T) -> T:
    """A benchmark size: the smoke or full value, or `JOBQUEUE_BENCH_<NAME>`
    (JSON: `[1, 10, 100]`, `5000`, `"shared"`)."""
    raw = os.environ.get(f"{PARAM_PREFIX}{name.upper()}")
    if raw is not None:
        try:
            return json.loads(raw)  # type: ignore[no-any-return]
        except json.JSONDecodeError:
            return raw  # type: ignore[return-value]
    return full if size() == "full" else smoke


def results_dir() -> Path:
    """Where results go: the committed `notebooks/benchmarks/results/` for
    full runs, the git-ignored `bench-results/smoke/` for smoke runs (so CI
    never overwrites the published figures)."""
    base = _CHECKOUT if (_CHECKOUT / "alembic.ini").exists() else Path.cwd()
    if size() == "full":
        path = base / "notebooks" / "benchmarks" / "results"
    else:
        path = base / "bench-results" / "smoke"
    path.mkdir(parents=True, exist_ok=True)
    return path


def checkout_commit() -> str:
    """The commit measured: `git rev-parse --short` of the checkout, with
    `+changes` when tracked files differ from it (beyond what a bench run
    rewrites), `unknown` outside a git checkout."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(_CHECKOUT), *args], capture_output=True,
                              text=True, check=True).stdout

    try:
        commit = git("rev-parse", "--short=12", "HEAD").strip()
        changed = [line[3:] for line in git("status", "--porcelain",
                                            "--untracked-files=no").splitlines()]
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    edits = [path for path in changed if not path.startswith(_RUN_OUTPUTS)]
    return commit + ("+changes" if edits else "")


def run_stamp() -> dict[str, str]:
    """Which run this is: the bench driver's start time and commit, or, for a
    notebook run by hand, `by hand` and the commit now."""
    return {"run": os.environ.get(RUN_ENV, "by hand"),
            "commit": os.environ.get(COMMIT_ENV) or checkout_commit()}


def save(rows: list[dict[str, Any]], name: str, context: dict[str, str],
         columns: Sequence[str] | None = None) -> Path:
    """Write `rows` to `<results_dir>/<name>.csv`, machine, settings and the run
    (`run_stamp`) first as `# key: value` lines (read back with `load`).
    `columns` is the header to write when `rows` may be empty (a run that saw
    no wait events): without one, `load` could not read the file back."""
    import pandas as pd

    path = results_dir() / f"{name}.csv"
    with path.open("w", newline="") as f:
        for key, value in {**context, **run_stamp(),
                           "written": datetime.now(UTC).isoformat(timespec="seconds"),
                           "size": size()}.items():
            f.write(f"# {key}: {value}\n")
        pd.DataFrame(rows, columns=None if rows else columns).to_csv(f, index=False)
    return path


def context(name: str, directory: Path | None = None) -> dict[str, str]:
    """A results file's `# key: value` lines (machine, settings, run), without
    reading its rows."""
    found: dict[str, str] = {}
    with ((directory or results_dir()) / f"{name}.csv").open() as f:
        for line in f:
            if not line.startswith("# "):
                break
            key, _, value = line[2:].partition(": ")
            found[key] = value.strip()
    return found


def load(name: str, directory: Path | None = None) -> tuple[Any, dict[str, str]]:
    """A results file as (DataFrame, context)."""
    import pandas as pd

    path = (directory or results_dir()) / f"{name}.csv"
    return pd.read_csv(path, comment="#"), context(name, directory)


def run_record(directory: Path) -> dict[str, Any]:
    """`run.json` beside the results, which the bench driver writes: the last
    full run and the partial reruns since ({} when there is none)."""
    try:
        return json.loads((directory / "run.json").read_text())  # type: ignore[no-any-return]
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
