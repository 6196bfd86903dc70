"""Where a series of benchmark runs is, for whoever waits on it.

Inside `make bench` the notebooks run in a kernel with no terminal, so a
progress bar drawn there would only end up as hundreds of stderr lines in
the committed notebook. When `JOBQUEUE_BENCH_PROGRESS` names a file (the
bench driver, `jobqueue.benchmarks.run`, sets it), each step of a series is
appended to that file as one JSON line instead, and the driver shows it on
the terminal; otherwise (a notebook opened by hand) it is a tqdm bar.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import TracebackType
from typing import Any

PROGRESS_ENV = "JOBQUEUE_BENCH_PROGRESS"


class Steps:
    """A series of `total` steps called `desc`: `update()` after each one."""

    def __init__(self, total: int, desc: str, path: Path) -> None:
        self.total, self.desc, self.path = total, desc, path
        self.done = 0
        self.started = time.time()

    def _write(self) -> None:
        line = {"desc": self.desc, "done": self.done, "total": self.total,
                "started": self.started, "t": time.time()}
        with self.path.open("a") as f:
            f.write(json.dumps(line) + "\n")

    def update(self, n: int = 1) -> None:
        self.done += n
        self._write()

    def __enter__(self) -> Steps:
        self._write()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        return None


def steps(total: int, desc: str) -> Any:
    """Progress of a series of runs: JSON lines for the bench driver when it
    listens (`PROGRESS_ENV`), a tqdm bar (notebook-aware) otherwise."""
    target = os.environ.get(PROGRESS_ENV)
    if target:
        return Steps(total, desc, Path(target))
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, leave=False)


def last(path: Path) -> dict[str, Any] | None:
    """The latest step written to `path` (None before the first)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            lines = f.read().decode(errors="replace").splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        try:
            return json.loads(line)  # type: ignore[no-any-return]
        except json.JSONDecodeError:
            continue
    return None
