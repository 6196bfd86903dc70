"""oban-py (`oban` on PyPI, the Python port of Elixir's Oban) as a peer. It
needs Python 3.12+ (jobqueue supports 3.11), so `oban==0.7.0` has a
virtualenv of its own in `<checkout>/bench-results/oban-py/` (git-ignored),
built with the first Python 3.12+ on PATH or pyenv's; without one it is
skipped with a one-line warning.

It runs as its production guide advises (`recommended`), `oban start
--queues default:<limit>`, its schema by `oban install`. It has no drain
mode: a drain stops its processes with SIGTERM (its graceful shutdown) once
no job is left to run, as jobqueue's are stopped.

**Timing.** A finished job's row keeps `inserted_at`, `attempted_at` (the
claim) and `completed_at`, each its statement's `now()`; `completed_at` is
written when its producer acknowledges a batch of finished jobs, at its
next fetch: the time a completion was recorded, as for every other system.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from jobqueue.benchmarks import adapter, rss, scenarios
from jobqueue.benchmarks.adapter import Peer
from jobqueue.benchmarks.peer_worker import NOOP, PROCESS_PAYMENT, WRITE_ROW
from jobqueue.testing import WorkerProcess

SYSTEM = "oban-py"
PACKAGE = "oban"
VERSION = "0.7.0"
INSTALL_DIR = Path(__file__).resolve().parents[2] / "bench-results" / "oban-py"
WORKERS = Path(__file__).with_name("oban_workers")
#: The queue limit of its docs' examples (`[queues] default = 10`).
DOCS_LIMIT = 10
#: The worker class oban-py runs for each of the lab's job types.
WORKER_NAMES = {NOOP: "bench_oban.Noop", WRITE_ROW: "bench_oban.WriteRow",
                PROCESS_PAYMENT: "bench_oban.ProcessPayment"}
#: A job run twice would have a second attempt: counted apart.
DRAIN_SQL = """
    SELECT count(*) FILTER (WHERE state = 'completed') AS completed,
           count(*) FILTER (WHERE state = 'completed' AND attempt = 1) AS distinct_completed,
           count(*) AS total,
           count(*) FILTER (WHERE state <> 'completed') AS left_in_queue,
           extract(epoch FROM min(attempted_at)) AS first,
           extract(epoch FROM max(completed_at)) AS last
    FROM oban_jobs"""
#: Nothing left to run: two probes of its (state, queue, …) index.
DONE_SQL = ("SELECT NOT EXISTS (SELECT FROM oban_jobs WHERE state = 'available')"
            " AND NOT EXISTS (SELECT FROM oban_jobs WHERE state = 'executing')")
#: Its processes up: each queue's producer writes its row once `oban start`
#: has its signal handlers (SIGTERM before that would kill it).
STARTED_SQL = "SELECT count(*) FROM oban_producers"
#: What `Oban.enqueue` sends (`queries/insert_job.sql` of 0.7.0), with its
#: defaults for what the lab's jobs leave unset: one row, and a NOTIFY that
#: wakes the producers of its queue.
INSERT_SQL = """
    WITH inserted AS (
        INSERT INTO oban_jobs (args, inserted_at, max_attempts, meta, priority, queue,
                               scheduled_at, state, tags, worker)
        VALUES ($1::jsonb, timezone('UTC', now()), 20, '{}', 0, 'default',
                timezone('UTC', now()), 'available', '{}', $2)
        RETURNING id, queue)
    SELECT id, pg_notify('public.oban_insert', '{"queue":"' || queue || '"}')
    FROM inserted"""


def python(folder: Path = INSTALL_DIR) -> Path:
    """The interpreter of oban-py's virtualenv."""
    return folder / "venv" / "bin" / "python"


def _python312() -> str | None:
    """The first Python 3.12 or newer on PATH or among pyenv's versions."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates = [shutil.which(f"python3.{minor}") for minor in (14, 13, 12)]
    candidates += [str(p) for p in sorted(root.glob("versions/3.1[2-9]*/bin/python3"))]
    for candidate in filter(None, candidates):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            if subprocess.run([candidate, "-c", "import sys; sys.exit(sys.version_info < (3, 12))"],
                              capture_output=True, timeout=30).returncode == 0:
                return candidate
    return None


def install(folder: Path = INSTALL_DIR) -> Path:
    """oban-py, pinned, in a virtualenv of its own in `folder`, once."""
    def ready() -> bool:
        return any((folder / "venv" / "lib").glob(
            f"python3.*/site-packages/{PACKAGE}-{VERSION}.dist-info"))

    if ready():
        return folder
    base = _python312()
    if base is None:
        raise RuntimeError("oban-py needs Python 3.12 or newer, and none was found")
    return adapter.install_once(
        folder, ready, [[base, "-m", "venv", "--clear", str(folder / "venv")],
                        [str(python(folder)), "-m", "pip", "install", "--quiet",
                         "--disable-pip-version-check", f"{PACKAGE}=={VERSION}"]],
        timeout=600.0)


def available() -> bool:
    return adapter.can_install(SYSTEM, install)


def limit_of(args: list[str]) -> int:
    """The queue limit a run's recorded arguments gave oban-py."""
    queues = dict(q.split(":", 1) for q in args[args.index("--queues") + 1].split(","))
    return int(queues["default"])


def process(url: str, log: Path, args: list[str], drain: bool = False) -> WorkerProcess:
    """One `oban start` process in its own virtualenv, the workers module on
    its path, the database in `OBAN_DSN` and in libpq's variables for the
    tasks' pool."""
    dsn = adapter.conninfo(url)
    return WorkerProcess(
        dsn, log, str(python(install())), "-m", "oban", "start", *args,
        cwd=WORKERS, command=("-c", rss.EXEC),
        env={**adapter.libpq_env(url), "OBAN_DSN": dsn, "PYTHONPATH": str(WORKERS),
             "BENCH_POOL_SIZE": str(limit_of(args))})


async def install_schema(url: str) -> None:
    """oban-py's tables, by its own CLI (`oban install`)."""
    await asyncio.to_thread(adapter.run, [str(python(install())), "-m", "oban", "install",
                                          "--dsn", adapter.conninfo(url)], timeout=120)


async def fill(url: str, n: int, handler: str) -> None:
    """The rows `Oban.enqueue_many` writes, one statement per chunk (it
    sends its insert once per job); no NOTIFY, as nothing listens yet."""
    async with scenarios.connected(url) as conn:
        for chunk in adapter.chunks([json.dumps(a) for a in adapter.arguments(n, handler, {})]):
            await conn.execute(
                "INSERT INTO oban_jobs (args, worker, queue, state)"
                " SELECT a, $2, 'default', 'available'"
                " FROM unnest($1::jsonb[]) WITH ORDINALITY AS u (a, i) ORDER BY i",
                chunk, WORKER_NAMES[handler])


def _versions() -> dict[str, str]:
    python_version = adapter.run([str(python()), "--version"], timeout=30)
    return {f"{SYSTEM}_version": VERSION,
            f"{SYSTEM}_python": python_version.strip().removeprefix("Python ") or "?"}


PEER = Peer(
    system=SYSTEM,
    label=lambda args, workers: (
        f"limit {limit_of(args)}, {adapter.processes(workers)}, `oban start`"),
    #: `oban start` with one queue of `limit` concurrent jobs.
    argv=lambda setup, handler: ["--queues", f"default:{int(setup.get('limit', DOCS_LIMIT))}"],
    install=install_schema, truncate="TRUNCATE oban_jobs, oban_producers, oban_leaders",
    tables=("oban_jobs",), fill=fill, worker=process,
    drained=adapter.logged(DRAIN_SQL, DONE_SQL, STARTED_SQL),
    columns=lambda args: {"batch_size": None, "concurrency": limit_of(args)},
    enqueue_one=lambda pool: lambda: pool.fetchval(INSERT_SQL, "{}", WORKER_NAMES[NOOP]),
    jobs_sql=("SELECT id, extract(epoch FROM inserted_at) AS enqueued,"
              " extract(epoch FROM attempted_at) AS started,"
              " extract(epoch FROM completed_at) AS completed FROM oban_jobs"),
    available=available, versions=lambda: _versions() if available() else {},
    recommended=(
        "Its production guide recommends its CLI, `oban start` (a JSON log line per job at "
        "INFO, pruning and orphan rescue on), with queues given as `name:limit`: its docs' "
        "examples use `default = 10`, with the connection pool at its defaults (1 to 10). "
        "It says nothing about throughput; the tasks write through a psycopg pool of their own, "
        "as large as the limit.",
        (("production", "https://github.com/oban-bg/oban-py/blob/main/docs/production.md"),
         ("defining queues",
          "https://github.com/oban-bg/oban-py/blob/main/docs/defining_queues.md"))))
