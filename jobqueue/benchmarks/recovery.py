"""Dead-worker recovery, measured (`recovery.ipynb`).

A trial: an active worker and a standby (real processes) work through a
stream of jobs; the active one receives SIGKILL (a crash) or SIGSTOP (a hang:
its connections stay open). Recovery is timed from the signal to the first
job the standby completes, on the database's clock. The active worker holds
its jobs one of two ways (`SETUPS`): in quick batches, whose transaction dies
with it, or claimed, committed as `processing`, which the standby must put
back (the rescue path). A rescue-path trial catches the worker holding
claimed jobs, and checks from a table the handler writes (a row per run that
committed) that each ran exactly once.
"""

from __future__ import annotations

import shlex
import signal
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg

from jobqueue import db
from jobqueue.benchmarks.recovery_runs import RUNS_TABLE
from jobqueue.benchmarks.scenarios import TRUNCATE_JOBS, steps, worker_options
from jobqueue.testing import WorkerProcess, wait_for, worker_state

SIGNALS = {"SIGKILL": signal.SIGKILL, "SIGSTOP": signal.SIGSTOP}
#: Seconds of work a trial's timeline shows after the first completion.
TIMELINE_AFTER = 0.5
HANDLER_MODULE = "jobqueue.benchmarks.recovery_runs"


@dataclass(frozen=True)
class Setup:
    """How the active worker holds its jobs: its extra flags, its jobs' length."""

    flags: tuple[str, ...]
    job_seconds: float


#: quick: the default for fast jobs (5 ms jobs in quick batches); claimed:
#: the same jobs with quick batches off; slow: jobs slower than the default
#: quick threshold (50 ms), which a worker claims one at a time per lane.
SETUPS = {"quick": Setup((), 0.005), "claimed": Setup(("--quick-batch", "0"), 0.005),
          "slow": Setup((), 0.1)}


def worker_argv(lease: float, batch_size: int, flags: Sequence[str] = ()) -> list[str]:
    """The command line both workers of a trial get (after `jobqueue worker`)."""
    return ["--import", HANDLER_MODULE, "--batch-size", str(batch_size), "--lease", f"{lease:g}",
            "--log-level", "WARNING", *flags]


def path_of(argv: Sequence[str], job_seconds: float) -> str:
    """"quick batches" or "claimed": how a worker given `argv` holds jobs of
    `job_seconds`, read from its own options."""
    quick = worker_options(argv).quick_batch
    return "quick batches" if 0 < quick and job_seconds < quick else "claimed"


def shown_flags(argv: Sequence[str]) -> str:
    """`argv` as a table shows it: without `--import MODULE` and the log level."""
    hidden = {"--import", "--log-level"}
    kept = [a for i, a in enumerate(argv)
            if a not in hidden and (i == 0 or argv[i - 1] not in hidden)]
    return shlex.join(kept)


def setups_table(names: Sequence[str], lease: float, batch_size: int = 10) -> Any:
    """What each setup will run, as a DataFrame."""
    import pandas as pd

    argvs = [(name, worker_argv(lease, batch_size, SETUPS[name].flags)) for name in names]
    return pd.DataFrame([{"setup": name, "path": path_of(argv, SETUPS[name].job_seconds),
                          "job (ms)": SETUPS[name].job_seconds * 1000,
                          "command": "jobqueue worker " + shlex.join(argv)}
                         for name, argv in argvs])


_HELD = ("SELECT id FROM jobs WHERE status = 'processing' AND worker_id = $1")
#: Is any of the worker's connections in the middle of a statement? Once none
#: is, a frozen worker can change nothing more in the database.
_QUIET = ("SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE state = 'active'"
          " AND datname = current_database()"
          " AND application_name LIKE 'jobqueue worker ' || $1::integer || ' %')")


async def _freeze(conn: asyncpg.Connection, worker: WorkerProcess, worker_id: int,
                  rescue: bool, attempts: int = 50) -> tuple[list[uuid.UUID], datetime]:
    """SIGSTOP the worker (on the rescue path, while it holds claimed jobs:
    a freeze that caught it holding none is undone and tried again) and wait
    until none of its statements runs: the jobs it holds, and when."""
    for _ in range(attempts):
        if rescue:
            await wait_for(lambda: conn.fetchval(_HELD + " LIMIT 1", worker_id), timeout=30,
                           interval=0.002, message="the active worker to hold a claimed job")
        worker.signal(signal.SIGSTOP)
        stopped = await conn.fetchval("SELECT clock_timestamp()")
        await wait_for(lambda: conn.fetchval(_QUIET, worker_id), timeout=10,
                       interval=0.002, message="the frozen worker's statements to end")
        held = [r["id"] for r in await conn.fetch(_HELD, worker_id)]
        if held or not rescue:
            return held, stopped
        worker.signal(signal.SIGCONT)
    raise RuntimeError(f"the active worker held no claimed job in {attempts} freezes")


_RUNS = """
    SELECT (SELECT count(*) FROM jobqueue_all_jobs AS j
             WHERE j.id = ANY($1::uuid[]) AND j.status = 'completed' AND j.worker_id = $2
               AND (SELECT count(*) FROM recovery_runs AS r WHERE r.job_id = j.id) = 1
           ) AS held_completed_once,
           (SELECT count(*) FROM jobqueue_all_jobs WHERE status = 'completed') AS completed,
           (SELECT count(*) FROM jobqueue_all_jobs AS j WHERE j.status = 'completed'
               AND (SELECT count(*) FROM recovery_runs AS r WHERE r.job_id = j.id) <> 1
           ) AS completed_not_once,
           (SELECT count(*) FROM (SELECT job_id FROM recovery_runs GROUP BY job_id
                                  HAVING count(*) > 1) AS twice) AS ran_twice"""


async def run_counts(conn: asyncpg.Connection, held: Sequence[uuid.UUID], standby_id: int
                     ) -> asyncpg.Record:
    """How the jobs ran, from the rows `recovery_run` wrote."""
    return await conn.fetchrow(_RUNS, list(held), standby_id)


async def _start_pair(url: str, conn: asyncpg.Connection, args: Sequence[str], log_dir: Path
                      ) -> tuple[list[WorkerProcess], WorkerProcess, int, int]:
    """Two workers, started at once, once one is active and one stands by."""
    workers = [WorkerProcess(url, log_dir / f"worker-{n}.log", *args) for n in (1, 2)]

    async def roles() -> dict[str, tuple[WorkerProcess, int]] | None:
        states = {}
        for w in workers:
            row = await worker_state(conn, w)
            if row is None:
                return None
            states[row["state"]] = (w, row["id"])
        return states if set(states) == {"active", "standby"} else None

    try:
        found = await wait_for(roles, timeout=60, message="one worker active, one standing by")
    except BaseException:
        for w in workers:
            w.close()
        raise
    (active, active_id), (_, standby_id) = found["active"], found["standby"]
    return workers, active, active_id, standby_id


async def recovery_trial(
    url: str,
    sig: signal.Signals,
    *,
    lease: float = 5.0,
    jobs: int = 3000,
    job_seconds: float = 0.005,
    batch_size: int = 10,
    flags: Sequence[str] = (),
    log_dir: Path | None = None,
) -> dict[str, Any]:
    """One crash (or hang) of the active worker under load: seconds to the
    standby's first completion (`seconds`) and to the start of its first job
    (`started_s`); on the claimed path, the jobs it held (`held_processing`),
    until the last was completed (`held_done_s`), how many ran exactly once."""
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="jobqueue-recovery-"))
    args = worker_argv(lease, batch_size, flags)
    path = path_of(args, job_seconds)
    conn = await db.connect(url, application_name="jobqueue recovery")
    workers: list[WorkerProcess] = []
    try:
        await conn.execute(RUNS_TABLE)
        await reset(conn)
        workers, active, active_id, standby_id = await _start_pair(url, conn, args, log_dir)
        # 20 jobs, or 0.2 s worth: past each lane's first job, which it
        # claims whatever the path (to learn how long jobs take).
        await stream(conn, jobs, job_seconds,
                     under_way=max(2, min(20, int(0.2 / job_seconds), jobs // 10)))

        held, signalled = await _freeze(conn, active, active_id, rescue=path == "claimed")
        if sig != signal.SIGSTOP:
            active.signal(sig)
            signalled = await conn.fetchval("SELECT clock_timestamp()")
        first = await wait_for(
            lambda: conn.fetchval(
                "SELECT min(completed_at) FROM jobqueue_all_jobs"
                " WHERE worker_id = $1 AND completed_at > $2",
                standby_id, signalled),
            timeout=lease + 30, interval=0.01, message="the standby's first completion")
        started = await conn.fetchval(
            "SELECT min(started_at) FROM jobqueue_all_jobs"
            " WHERE worker_id = $1 AND started_at > $2",
            standby_id, signalled)
        in_flight = await conn.fetchval(
            "SELECT count(*) FROM jobs WHERE status = 'processing' AND worker_id <> $1",
            standby_id)
        held_done = await wait_for(
            lambda: conn.fetchval(
                "SELECT max(completed_at) FROM jobqueue_all_jobs WHERE id = ANY($1::uuid[])"
                " HAVING count(*) FILTER (WHERE status = 'completed') = $2", held, len(held)),
            timeout=lease + 30, interval=0.01, message="every held job completed") if held else None
        runs = await run_counts(conn, held, standby_id)
        return {
            "path": path, "flags": shown_flags(args), "job_ms": job_seconds * 1000,
            "signal": sig.name, "seconds": (first - signalled).total_seconds(),
            "started_s": (started - signalled).total_seconds(),
            "lease": lease, "batch_size": batch_size, "held_processing": len(held),
            "held_done_s": (held_done - signalled).total_seconds() if held_done else None,
            "held_completed_once": runs["held_completed_once"],
            "left_processing": in_flight, "completed": runs["completed"],
            "completed_not_once": runs["completed_not_once"], "ran_twice": runs["ran_twice"],
            "argv": shlex.join(args),
            "timeline": await timeline(conn, signalled, first, standby_id)}
    finally:
        for w in workers:
            w.close()
        await conn.close()


async def recovery_series(url: str, *, signals: Sequence[str], trials: int, lease: float,
                          jobs: int, setups: Sequence[str] | None = None
                          ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`trials` of each setup (all unless told) and signal: a row per trial,
    and the completions around each signal."""
    setups = list(SETUPS) if setups is None else setups
    times, timelines = [], []
    for setup, name, trial in steps("recovery", setups, signals, range(1, trials + 1)):
        result = await recovery_trial(url, SIGNALS[name], lease=lease, jobs=jobs,
                                      flags=SETUPS[setup].flags,
                                      job_seconds=SETUPS[setup].job_seconds)
        timelines += [{"setup": setup, "signal": name, "trial": trial, **point}
                      for point in result.pop("timeline")]
        times.append({"setup": setup, **result, "trial": trial})
    return times, timelines


async def reset(conn: asyncpg.Connection) -> None:
    await conn.execute(f"{TRUNCATE_JOBS}, recovery_runs; DELETE FROM jobqueue_workers")


async def stream(conn: asyncpg.Connection, jobs: int, job_seconds: float, under_way: int
                 ) -> None:
    """Queue `jobs` jobs due one after another, as a stream's are (with one
    run_at, a job put back could be taken after every other instead of
    first); return once `under_way` are completed."""
    await conn.execute(
        "INSERT INTO jobs (job_type, payload, run_at) SELECT 'recovery_run',"
        " jsonb_build_object('seconds', $1::float8), clock_timestamp()"
        " FROM generate_series(1, $2)", job_seconds, jobs)
    await wait_for(lambda: conn.fetchval(
        "SELECT count(*) >= $1 FROM jobqueue_all_jobs WHERE status = 'completed'", under_way),
        timeout=60, message="work under way")


async def timeline(conn: asyncpg.Connection, signalled: datetime, first: datetime,
                   standby_id: int | None = None) -> list[dict[str, Any]]:
    """Jobs completed per 100 ms (`t` from the signal) from 1 s before the
    signal to TIMELINE_AFTER s after `first`, by worker: "second" is the
    standby's (`standby_id`), "first" any other's."""
    await wait_for(lambda: conn.fetchval(
        "SELECT clock_timestamp() > $1::timestamptz + make_interval(secs => $2)", first,
        TIMELINE_AFTER), timeout=10, interval=0.05, message="some work after recovery")
    rows = await conn.fetch(
        "SELECT CASE WHEN worker_id = $1 THEN 'second' ELSE 'first' END AS worker,"
        " CAST(floor(extract(epoch FROM completed_at - $2) * 10) / 10 AS float8) AS t,"
        " count(*) AS jobs FROM jobqueue_all_jobs"
        " WHERE completed_at BETWEEN $2::timestamptz - interval '1 second'"
        " AND $3::timestamptz + make_interval(secs => $4)"
        " GROUP BY 1, 2 ORDER BY 2, 1", standby_id, signalled, first, TIMELINE_AFTER)
    return [dict(r) for r in rows]
