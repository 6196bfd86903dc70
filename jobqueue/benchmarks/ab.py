"""The worker before and after a change: `make bench-ab OLD=<rev> [NEW=<rev>]`.

The project's rule: a change to the worker is measured before and after in
one interleaved run on three workloads, with the worker started exactly as
the README starts it. This is that run. Each side is a revision checked out
into a temporary `git worktree` (NEW by default: this checkout as it is,
uncommitted changes and all), with a database of its own on the same server
(`jobqueue_bench_ab_<id>_old`, `_new`) migrated by its own `python -m
jobqueue migrate`, and its workers (`jobqueue worker --import
jobqueue.benchmarks.handlers`: the CLI's defaults, INFO logs to a file) run
its own code (`scenarios.running`). The jobs are queued and timed by this
checkout's lab, the same for both sides:

- a no-op drain (`scenarios.cli_drain`): N jobs queued before the worker
  starts, jobs/s from the first claim to the last completion (the jobs' own
  timestamps, on the database's clock);
- a `write_row` drain, the same with one INSERT per job;
- one job's latency (`scenarios.open_loop`): jobs arriving one by one at a
  fixed rate (open loop) to an idle worker, p50/p95/p99 of enqueue to
  completion, the warm-up second left out.

In every round each workload runs on both sides one right after the other,
the side going first alternating by round, so that a slow spell of the
machine hits both. The tables give each side's median over the rounds and
NEW/OLD per round with its median: the figure to quote. Rows go to
`bench-results/ab-<stamp>.csv` with both sides' commits and the machine.

    python -m jobqueue.benchmarks.ab OLD [NEW] [--rounds 4] [--noop 50000]
        [--write-row 5000] [--rate 100] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jobqueue.benchmarks import scenarios
from jobqueue.schema import migrations

#: The checkout this module runs from: NEW when no NEW revision is given.
CHECKOUT = Path(__file__).resolve().parents[2]
#: Each workload's measures, in table order (`TITLES` says which way is better).
MEASURES = {"noop": ("jobs_per_sec",), "write_row": ("jobs_per_sec",),
            "latency": ("p50_ms", "p95_ms", "p99_ms")}
SIDES = ("old", "new")
CSV_FIELDS = ("round", "first", "workload", "n", "measure", "side", "commit", "value", "argv")


class BadRevision(Exception):
    """A revision git does not know: a one-line error, exit 2."""


@dataclass
class Side:
    """One side of the comparison; `commit`, `changes`, `code` and `schema`
    are read back from what ran, not from what was asked."""

    name: str
    rev: str
    checkout: Path
    commit: str = ""
    changes: bool = False
    code: str = ""
    schema: str = ""
    url: str = ""

    @property
    def label(self) -> str:
        return (f"{self.name.upper()} {self.commit[:9]}"
                + (" + uncommitted changes" if self.changes else ""))


def git(*args: str, cwd: Path = CHECKOUT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                          check=True).stdout.strip()


def resolve(rev: str) -> str:
    """`rev`'s commit; BadRevision if git knows no such commit."""
    try:
        return git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except (subprocess.CalledProcessError, OSError):
        raise BadRevision(f"no such revision in {CHECKOUT}: {rev!r}") from None


@contextlib.contextmanager
def checked_out(commit: str | None, path: Path) -> Iterator[Path]:
    """`commit` in a temporary worktree at `path`, removed on the way out;
    None: this checkout, as it is."""
    if commit is None:
        yield CHECKOUT
        return
    git("worktree", "add", "--detach", "--quiet", str(path), commit)
    try:
        yield path
    finally:
        git("worktree", "remove", "--force", str(path))


def side_process(checkout: Path, *argv: str, url: str = "") -> subprocess.CompletedProcess[str]:
    """`python argv` running `checkout`'s code as its workers do."""
    how = scenarios.running(checkout)
    env = {**os.environ, **how["env"], **({"DATABASE_URL": url} if url else {})}
    return subprocess.run([sys.executable, *argv], cwd=how["cwd"], env=env,
                          capture_output=True, text=True)


def code_of(checkout: Path) -> str:
    """The directory of the `jobqueue` that a process started as the side's
    workers are imports; RuntimeError unless it lies in `checkout`."""
    done = side_process(checkout, "-c", "import jobqueue; print(jobqueue.__file__)")
    code = Path(done.stdout.strip()).parent
    if done.returncode != 0 or not code.is_relative_to(checkout):
        raise RuntimeError(f"a process meant to run {checkout}'s code imports jobqueue "
                           f"from {code}: {done.stderr.strip()[-500:]}")
    return str(code)


async def migrate(checkout: Path, url: str) -> None:
    """`python -m jobqueue migrate` with `checkout`'s code: its own schema."""
    done = await asyncio.to_thread(side_process, checkout, "-m", "jobqueue", "migrate", url=url)
    if done.returncode != 0:
        raise RuntimeError(f"jobqueue migrate at {checkout} failed: {done.stderr[-2000:]}")


@contextlib.asynccontextmanager
async def side_database(side: Side, run_id: str) -> AsyncIterator[str]:
    """A benchmark database of the side's own, migrated by its code, dropped
    on the way out."""
    name = f"ab_{run_id}_{side.name}"
    try:
        yield await scenarios.open_bench(
            name, migrate=lambda url: migrate(side.checkout, url))
    finally:
        await scenarios.close_bench(name)


async def read_back(side: Side) -> None:
    """What the side is: its checkout's commit and changes, the code its
    processes import, the schema its migration left."""
    side.commit = git("rev-parse", "HEAD", cwd=side.checkout)
    side.changes = bool(git("status", "--porcelain", cwd=side.checkout))
    side.code = code_of(side.checkout)
    side.schema = await migrations.current(side.url) or "none"


async def measure(workload: str, side: Side, args: argparse.Namespace,
                  log_dir: Path) -> dict[str, Any]:
    """One run of `workload` by the side's worker at the CLI's defaults: its
    measures, how many jobs they are over, the worker's arguments."""
    log_dir.mkdir(parents=True)
    if workload == "latency":
        result = await scenarios.open_loop(
            side.url, rate=args.rate, seconds=scenarios.WARMUP_SECONDS + args.seconds,
            flags=[], log_dir=log_dir, checkout=side.checkout)
        s = result["summary"]
        return {"n": s["samples"], "argv": s["argv"],
                **{m: s[f"complete_{m}"] for m in MEASURES["latency"]}}
    row = await scenarios.cli_drain(side.url, n=getattr(args, workload), handler=workload,
                                    log_dir=log_dir, memory=False, checkout=side.checkout)
    return {"n": row["n"], "argv": row["argv"], "jobs_per_sec": row["jobs_per_sec"]}


def order(round_: int) -> tuple[str, str]:
    """Which side goes first: OLD in odd rounds, NEW in even ones."""
    return SIDES if round_ % 2 else SIDES[::-1]


async def rounds(sides: dict[str, Side], args: argparse.Namespace,
                 log_dir: Path) -> list[dict[str, Any]]:
    """Every workload on both sides, one after the other, in each round."""
    rows = []
    for round_ in range(1, args.rounds + 1):
        first = order(round_)
        for workload in MEASURES:
            for name in first:
                side = sides[name]
                row = await measure(workload, side, args,
                                    log_dir / f"{round_}-{workload}-{name}")
                rows.append({"round": round_, "first": first[0], "workload": workload,
                             "side": name, **row})
                print(f"round {round_}/{args.rounds}, {workload}, {side.label}: "
                      + ", ".join(f"{m} {row[m]:,.1f}" for m in MEASURES[workload]),
                      file=sys.stderr, flush=True)
    return rows


async def run(args: argparse.Namespace, old: str, new: str | None) -> dict[str, Any]:
    """Both sides checked out and migrated, the rounds, everything removed
    again: the rows, the sides and the machine."""
    run_id = uuid.uuid4().hex[:6]
    with tempfile.TemporaryDirectory(prefix="jobqueue-ab-") as tmp, \
            checked_out(old, Path(tmp) / "old") as old_tree, \
            checked_out(new, Path(tmp) / "new") as new_tree:
        sides = {"old": Side("old", args.old, old_tree),
                 "new": Side("new", args.new or "the work tree", new_tree)}
        async with contextlib.AsyncExitStack() as stack:
            for side in sides.values():
                side.url = await stack.enter_async_context(side_database(side, run_id))
                await read_back(side)
            context = await scenarios.environment(sides["old"].url)
            rows = await rounds(sides, args, Path(tmp) / "logs")
    return {"rows": rows, "sides": sides, "context": context}


def values(rows: Sequence[dict[str, Any]], workload: str, measure: str,
           side: str) -> dict[int, float]:
    return {r["round"]: r[measure] for r in rows
            if r["workload"] == workload and r["side"] == side}


def ratios(rows: Sequence[dict[str, Any]], workload: str, measure: str) -> dict[int, float]:
    """NEW/OLD in each round: the two ran back to back, so one ratio per round."""
    old, new = (values(rows, workload, measure, s) for s in SIDES)
    return {r: new[r] / old[r] for r in old}


TITLES = {"noop": "no-op drain of {n:,} jobs (jobs/s, higher is better)",
          "write_row": "write_row drain of {n:,} jobs (jobs/s, higher is better)",
          "latency": "one job's latency, enqueue to completion, {rate:g} jobs/s arriving one "
                     "by one, {n:,} jobs counted (ms, lower is better)"}


def table(rows: Sequence[dict[str, Any]], workload: str, sides: dict[str, Side],
          args: argparse.Namespace) -> str:
    """A workload's measures: each side's median over the rounds, NEW/OLD
    in each round and the median of those."""
    n = next(r["n"] for r in rows if r["workload"] == workload)
    lines = [TITLES[workload].format(n=n, rate=args.rate), "",
             f"| measure | {sides['old'].label} | {sides['new'].label} | NEW/OLD by round "
             "| NEW/OLD (median) |", "|---|---:|---:|---|---:|"]
    for m in MEASURES[workload]:
        old, new = (statistics.median(values(rows, workload, m, s).values()) for s in SIDES)
        each = ratios(rows, workload, m)
        lines.append(f"| {m} | {old:,.1f} | {new:,.1f} | "
                     f"{', '.join(f'{v:.3f}' for v in each.values())} | "
                     f"{statistics.median(each.values()):.3f} |")
    return "\n".join(lines)


def report(results: dict[str, Any], args: argparse.Namespace) -> str:
    """What the terminal shows: both sides, the machine, a table per workload."""
    c, sides = results["context"], results["sides"]
    argv = {r["argv"] for r in results["rows"]}
    lines = [f"{s.label}: {s.rev}, code {s.code}, schema {s.schema}" for s in sides.values()]
    lines += [f"Machine: {c['cpu']}, {c['cores']} cores, {c['ram']} RAM; "
              f"{c['postgres'].split(' on ')[0]}, fsync={c['fsync']}, "
              f"synchronous_commit={c['synchronous_commit']}",
              "Workers: " + "; ".join(scenarios.worker_label(shlex.split(a)) for a in argv),
              f"{args.rounds} round(s), first: "
              + ", ".join(order(r)[0].upper() for r in range(1, args.rounds + 1)), ""]
    return "\n".join(lines + [f"{table(results['rows'], w, sides, args)}\n" for w in MEASURES])


def write_csv(path: Path, results: dict[str, Any]) -> None:
    """A row per round, workload, measure and side, and NEW/OLD as side
    `new/old`; both sides and the machine first as `# key: value` lines."""
    rows, sides = results["rows"], results["sides"]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        for s in sides.values():
            f.write(f"# {s.name}: {s.rev}, commit {s.commit}"
                    f"{' + uncommitted changes' if s.changes else ''}, code {s.code}, "
                    f"schema {s.schema}\n")
        f.writelines(f"# {key}: {value}\n" for key, value in results["context"].items())
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            writer.writerows({**r, "measure": m, "value": r[m], "commit": sides[r["side"]].commit}
                             for m in MEASURES[r["workload"]])
        for w, ms in MEASURES.items():
            for m in ms:
                writer.writerows({"round": round_, "workload": w, "measure": m,
                                  "side": "new/old", "value": v}
                                 for round_, v in ratios(rows, w, m).items())


def positive(kind: type[int] | type[float]) -> Any:
    def parse(text: str) -> int | float:
        value = kind(text.replace("_", ""))
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
        return value
    return parse


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m jobqueue.benchmarks.ab",
                                description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("old", metavar="OLD", help="the revision before the change")
    p.add_argument("new", metavar="NEW", nargs="?",
                   help="the revision after it (default: this work tree as it is)")
    p.add_argument("--rounds", type=positive(int), default=4, help="(default %(default)s)")
    p.add_argument("--noop", type=positive(int), default=50_000,
                   help="jobs of the no-op drain (default %(default)s)")
    p.add_argument("--write-row", type=positive(int), default=5_000,
                   help="jobs of the write_row drain (default %(default)s)")
    p.add_argument("--rate", type=positive(float), default=100.0,
                   help="jobs/s arriving for the latency (default %(default)s)")
    p.add_argument("--seconds", type=positive(float), default=20.0,
                   help="seconds of arrivals counted for the latency, after a warm-up "
                        "second (default %(default)s)")
    p.add_argument("--results", type=Path, default=Path("bench-results"),
                   help="where the CSV goes (default %(default)s)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        old, new = resolve(args.old), (resolve(args.new) if args.new else None)
    except BadRevision as e:
        print(f"bench-ab: {e}", file=sys.stderr)
        return 2
    try:
        results = asyncio.run(run(args, old, new))
    except (RuntimeError, TimeoutError) as e:  # a side that would not migrate or run
        print(f"bench-ab: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench-ab: interrupted (its worktrees and databases are removed)", file=sys.stderr)
        return 130
    print(report(results, args))
    path = args.results / f"ab-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.csv"
    write_csv(path, results)
    print(f"Raw results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
