"""`python -m jobqueue.benchmarks.ab`, at toy size: both sides run as real
processes with their own code and databases, the rows say what ran, and
nothing is left behind."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import asyncpg

from jobqueue import db
from jobqueue.benchmarks import ab

WORKER_ARGV = "--import jobqueue.benchmarks.handlers"  # the README's worker, CLI defaults
HANDLERS = "jobqueue/benchmarks/handlers.py"
#: Appended to OLD's handlers module: every process that imports it leaves
#: a file saying how it was started, so the test sees which code each ran.
MARK = """
import os as _os, sys as _sys
with open(_os.path.join(_os.environ["JOBQUEUE_TEST_AB_MARKS"], str(_os.getpid())), "w") as _f:
    _f.write(" ".join(_sys.argv))
"""


def _ab(server_url: str, *args: str, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    """The command as `make bench-ab` runs it: from the checkout, where
    `python -m` finds this checkout's code first unless a side's processes
    are started elsewhere."""
    return subprocess.run([sys.executable, "-m", "jobqueue.benchmarks.ab", *args],
                          cwd=ab.CHECKOUT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "DATABASE_URL": server_url, **(env or {})})


def _commit_with(tmp_path: Path, path: str, content: str) -> str:
    """A commit of HEAD with one file's content replaced, made through an index
    of its own: no branch, no work tree touched (unreferenced, gc drops it)."""
    env = {**os.environ, "GIT_INDEX_FILE": str(tmp_path / "index"), "GIT_AUTHOR_NAME": "test",
           "GIT_AUTHOR_EMAIL": "test@example.invalid", "GIT_COMMITTER_NAME": "test",
           "GIT_COMMITTER_EMAIL": "test@example.invalid"}

    def git(*args: str, stdin: str | None = None) -> str:
        return subprocess.run(["git", *args], cwd=ab.CHECKOUT, env=env, input=stdin,
                              capture_output=True, text=True, check=True).stdout.strip()

    git("read-tree", "HEAD")
    blob = git("hash-object", "-w", "--stdin", stdin=content)
    git("update-index", "--cacheinfo", f"100644,{blob},{path}")
    return git("commit-tree", git("write-tree"), "-p", "HEAD", "-m", "test: another side")


def _header(path: Path) -> dict[str, str]:
    return dict(line[2:].rstrip("\n").split(": ", 1) for line in path.open()
                if line.startswith("# "))


async def _nothing_left(server_url: str) -> None:
    """No temporary worktree, no database of a run."""
    assert "jobqueue-ab-" not in ab.git("worktree", "list")
    conn = await asyncpg.connect(**db.asyncpg_connect_args(server_url))
    try:
        assert await conn.fetch(
            "SELECT datname FROM pg_database WHERE datname LIKE 'jobqueue\\_bench\\_ab\\_%'") == []
    finally:
        await conn.close()


async def test_each_side_runs_its_own_code(server_url: str, tmp_path: Path) -> None:
    """OLD is HEAD with a handlers module that marks every process importing
    it: exactly OLD's three workers do, started as the README starts them."""
    old = _commit_with(tmp_path, HANDLERS, ab.git("show", f"HEAD:{HANDLERS}") + MARK)
    marks = tmp_path / "marks"
    marks.mkdir()
    done = _ab(server_url, old, "--rounds", "1", "--noop", "200", "--write-row", "100",
               "--rate", "20", "--seconds", "1", "--results", str(tmp_path / "out"),
               env={"JOBQUEUE_TEST_AB_MARKS": str(marks)})
    assert done.returncode == 0, done.stderr
    (path,) = (tmp_path / "out").glob("ab-*.csv")
    sides = _header(path)
    assert sides["old"].startswith(f"{old}, commit {old}, code ")
    old_code = Path(sides["old"].split(", code ")[1].split(",")[0])
    assert old_code.parent.name == "old" and not old_code.exists()  # its worktree, removed
    head = ab.git("rev-parse", "HEAD")
    assert sides["new"].startswith(f"the work tree, commit {head}")
    assert f", code {ab.CHECKOUT / 'jobqueue'}, schema " in sides["new"]
    started = sorted(m.read_text() for m in marks.iterdir())
    assert started == [f"{old_code / '__main__.py'} worker {WORKER_ARGV}"] * 3
    await _nothing_left(server_url)

    rows = list(csv.DictReader(line for line in path.open() if not line.startswith("#")))
    measured = [r for r in rows if r["side"] != "new/old"]
    assert sorted((r["workload"], r["measure"], r["side"]) for r in measured) == sorted(
        (w, m, s) for w, ms in ab.MEASURES.items() for m in ms for s in ab.SIDES)
    assert {(r["side"], r["commit"]) for r in measured} == {("old", old), ("new", head)}
    assert {(r["round"], r["first"], r["argv"]) for r in measured} == {("1", "old", WORKER_ARGV)}
    assert {r["workload"]: r["n"] for r in measured if r["workload"] != "latency"} == {
        "noop": "200", "write_row": "100"}
    assert all(float(r["value"]) > 0 for r in rows)
    value = {(r["workload"], r["measure"], r["side"]): float(r["value"]) for r in rows}
    for w, ms in ab.MEASURES.items():
        for m in ms:
            assert value[w, m, "new/old"] == value[w, m, "new"] / value[w, m, "old"]
    assert "no-op drain of 200 jobs" in done.stdout and "| p99_ms |" in done.stdout


async def test_a_side_that_cannot_run_stops_the_run(server_url: str, tmp_path: Path) -> None:
    """OLD's workers cannot import their handlers: the run ends with OLD's
    worker log, writes no results and leaves nothing behind."""
    old = _commit_with(tmp_path, HANDLERS, 'raise ImportError("the handlers of the OLD side")\n')
    done = _ab(server_url, old, "--rounds", "1", "--noop", "10", "--write-row", "10",
               "--rate", "10", "--seconds", "1", "--results", str(tmp_path / "out"))
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("bench-ab: worker exited with ")
    assert "ImportError: the handlers of the OLD side" in done.stderr
    assert not (tmp_path / "out").exists()
    await _nothing_left(server_url)


def test_a_bad_revision_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = _ab("postgresql://nowhere/none", "no-such-revision", "--results", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"bench-ab: no such revision in {ab.CHECKOUT}: 'no-such-revision'"]
    assert not list(tmp_path.iterdir())
