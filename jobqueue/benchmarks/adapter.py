"""The one interface every system of the comparison sits behind (`Peer`),
and what its adapters share: `peers` runs any `Peer` the same way, so a new
queue is one module that builds one."""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import logging
import os
import subprocess
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from jobqueue import db
from jobqueue.benchmarks import scenarios
from jobqueue.benchmarks.peer_worker import PROCESS_PAYMENT, build_parser
from jobqueue.testing import WorkerProcess

logger = logging.getLogger(__name__)

FILL_CHUNK = 10_000
PEER_WORKER = Path(__file__).with_name("peer_worker.py")


@dataclass(frozen=True)
class Drain:
    """What a peer's `drained` gets: the jobs `fill` queued, its processes."""

    system: str
    conn: asyncpg.Connection
    procs: Sequence[WorkerProcess]
    filled: Any
    n: int
    handler: str
    timeout: float


def _unsupported(*_: Any) -> Any:
    raise ValueError("this system does not take part in this kind of run")


@dataclass(frozen=True)
class Peer:
    """One system: install it, queue n jobs, start its workers as its docs
    advise, read back when each job ran. A setup becomes its processes'
    arguments (`argv`), and a row says of the setup only what is read back
    from those (`label`, `columns`, `preset`)."""

    system: str
    label: Callable[[list[str], int], str]
    argv: Callable[[Mapping[str, Any], str], list[str]] = lambda setup, handler: []
    #: Its schema, by its own API or CLI, into a new database's URL.
    install: Callable[[str], Awaitable[Any]] = _unsupported
    #: Empties its tables before a run; `tables` are its own tables a job's
    #: life writes to: vacuumed before each run, scanned by pressure's readers.
    truncate: str = ""
    tables: tuple[str, ...] = ()
    #: (url, n, handler): n jobs through its own batch API; returns what `drained` needs.
    fill: Callable[[str, int, str], Awaitable[Any]] = _unsupported
    #: (url, log, argv, drain): one worker process; `drain` asks for its mode
    #: that exits once the queue is empty, if it has one.
    worker: Callable[[str, Path, list[str], bool], WorkerProcess] = _unsupported
    #: Waits for the drain to end, checks every job ran exactly once, and
    #: returns (first claim, last completion) on the database's clock.
    drained: Callable[[Drain], Awaitable[tuple[float, float]]] = _unsupported
    #: The `batch_size` and `concurrency` columns, from the recorded arguments.
    columns: Callable[[list[str]], dict[str, int | None]] = (
        lambda args: {"batch_size": None, "concurrency": None})
    #: One job in its own transaction on an asyncpg pool (the same client for
    #: every system in the open-loop runs); returns its id (or a list of one).
    enqueue_one: Callable[[asyncpg.Pool], Callable[[], Awaitable[Any]]] = _unsupported
    #: Each job's id and (enqueued, started, completed) epoch seconds, from
    #: its own tables: the open-loop runs' figures.
    jobs_sql: str = ""
    preset: Callable[[list[str], int], str] = lambda args, workers: ""
    available: Callable[[], bool] = lambda: True
    versions: Callable[[], dict[str, str]] = dict
    #: What runs its drains instead (row, RSS timeline), for a system with a
    #: drain of its own: (url, setup, n, handler, memory).
    own_drain: Callable[..., Awaitable[tuple[dict[str, Any], list[dict[str, Any]]]]] | None = None
    #: What opens its database instead of creating one and calling `install`.
    open: Callable[[str], Awaitable[str]] | None = None
    #: What its documentation advises for throughput, in this lab's words
    #: (read 2026-12-01), and the (name, URL) of the pages that say it:
    #: printed beside every table, under the setups that ran.
    recommended: tuple[str, tuple[tuple[str, str], ...]] = ("", ())


# -- what the adapters share ----------------------------------------------------------


def libpq_env(url: str) -> dict[str, str]:
    """The database as libpq's environment variables (asyncpg and psycopg
    read them): a peer's process needs no URL parser of ours."""
    args = db.asyncpg_connect_args(url)
    names = {"host": "PGHOST", "port": "PGPORT", "user": "PGUSER",
             "password": "PGPASSWORD", "database": "PGDATABASE"}
    return {names[k]: str(v) for k, v in args.items() if k in names}


def conninfo(url: str) -> str:
    """A libpq connection string for psycopg."""
    from psycopg.conninfo import make_conninfo

    args = db.asyncpg_connect_args(url)
    if "database" in args:
        args["dbname"] = args.pop("database")
    return make_conninfo(**{k: str(v) for k, v in args.items() if k != "ssl"})


def arguments(n: int, handler: str, empty: Any = None) -> list[Any]:
    """Each job's arguments: `scenarios.payments` for `process_payment`, else `empty`."""
    return scenarios.payments(n) if handler == PROCESS_PAYMENT else [empty] * n


def chunks(items: Sequence[Any]) -> list[Sequence[Any]]:
    return [items[i:i + FILL_CHUNK] for i in range(0, len(items), FILL_CHUNK)]


def processes(workers: int) -> str:
    return f"{workers} process{'es' if workers > 1 else ''}"


def installed(package: str) -> bool:
    """Whether a Python peer is installed here; one warning line otherwise."""
    if importlib.util.find_spec(package) is not None:
        return True
    logger.warning("%s is not installed (`make setup` installs the peers): skipped", package)
    return False


def package_version(system: str, package: str) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    with contextlib.suppress(PackageNotFoundError):
        return {f"{system}_version": version(package)}
    return {}


def run(command: Sequence[str], *, timeout: float, cwd: Path | None = None,
        env: Mapping[str, str] | None = None) -> str:
    """A short command (an install, a schema); its output, or RuntimeError
    with the tail of it."""
    done = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True,
                          env=None if env is None else {**os.environ, **env}, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(str(c) for c in command[:4])} exited with "
                           f"{done.returncode}: {(done.stdout + done.stderr)[-2000:]}")
    return done.stdout


def install_once(folder: Path, ready: Callable[[], bool], steps: Sequence[Sequence[str]], *,
                 timeout: float, before: Callable[[], Any] = lambda: None) -> Path:
    """A pinned peer installed into `folder` by `steps` unless `ready()`,
    under a file lock (two callers must not install at once)."""
    if ready():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ready():
            before()
            logger.info("installing into %s: %s", folder, steps[-1])
            for step in steps:
                run(step, timeout=timeout, cwd=folder)
            if not ready():
                raise RuntimeError(f"{steps[-1]} did not install what it should into {folder}")
    return folder


def can_install(system: str, install: Callable[[], Any]) -> bool:
    """Whether `install()` works (installing now if need be); False with a
    one-line warning otherwise (the comparison skips the system)."""
    try:
        install()
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        logger.warning("%s skipped: %s", system, str(e).splitlines()[0])
        return False
    return True


def python_peer(system: str, knob: str, word: str, **fields: Any) -> Peer:
    """A peer whose package (named as the system) is in the lab's virtualenv
    and whose worker is `peer_worker.py <system>`, with one knob (`knob`, a
    column and a flag of `peer_worker`'s, shown as `word` in its label)."""
    def start(url: str, log: Path, args: list[str], drain: bool) -> WorkerProcess:
        return WorkerProcess(url, log, *args, *(["--drain"] if drain else []),
                             command=("-P", str(PEER_WORKER), system), env=libpq_env(url))

    def value(args: list[str]) -> int:
        return int(getattr(build_parser().parse_args([system, *args]), knob))

    return Peer(system=system, worker=start, available=lambda: installed(system),
                versions=lambda: package_version(system, system),
                label=lambda args, workers: f"{word} {value(args)}, {processes(workers)}",
                argv=lambda setup, handler: [f"--{knob.replace('_', '-')}", str(
                    setup.get(knob, build_parser().get_default(knob)))],
                columns=lambda args: {"batch_size": None, "concurrency": None,
                                      knob: value(args)}, **fields)


def events_sql(table: str, at: str, kind: str, kinds: Sequence[str]) -> str:
    """`jobs_sql` from a table of one row per job and transition."""
    times = ", ".join(
        f"extract(epoch FROM min({at}) FILTER (WHERE {kind} = '{k}')) AS {name}"
        for name, k in zip(("enqueued", "started", "completed"), kinds, strict=True))
    return f"SELECT job_id AS id, {times} FROM {table} GROUP BY job_id"


def logged(drain_sql: str, done_sql: str | None = None, started_sql: str = "SELECT 0"
           ) -> Callable[[Drain], Awaitable[tuple[float, float]]]:
    """`drained` for a system that records each job's completion: wait for
    its processes to exit (its drain mode), or, without one (`done_sql`),
    stop them with SIGTERM once nothing is left to run and every process has
    started (`started_sql` counts them: a small drain can end before a
    second process has its signal handlers), as jobqueue's are stopped; then
    `drain_sql` (completed, distinct_completed, total, left_in_queue, first,
    last) must show every job completed exactly once."""
    async def drained(run: Drain) -> tuple[float, float]:
        if done_sql is None:
            for p in run.procs:
                await p.finish(run.timeout)
        else:
            await scenarios.until_done(
                run.conn, run.procs, run.timeout, registered=False,
                done_sql=f"SELECT ({done_sql}) AND ({started_sql}) >= {len(run.procs)}")
        row = await run.conn.fetchrow(drain_sql)
        counts = (row["completed"], row["distinct_completed"], row["total"],
                  row["left_in_queue"])
        if counts != (run.n, run.n, run.n, 0):
            raise RuntimeError(
                f"{run.system} lost or repeated jobs: {counts[0]} completions of "
                f"{counts[1]} distinct jobs, {counts[2]} queued, {counts[3]} left,"
                f" expected {run.n}")
        return float(row["first"]), float(row["last"])
    return drained
