"""PostgreSQL failover, measured: how long a worker takes to get back to work
on a promoted standby, and what the promotion itself costs.

A trial: a primary and its synchronous standby (`jobqueue.embedded.pair`),
one `jobqueue worker` whose DATABASE_URL names both, and the recovery
trials' stream of jobs. Under way, the primary's postmaster gets SIGKILL and
the standby is promoted at once, as a failover manager would once it has
decided (its own detection delay, seconds in Patroni or a cloud service, is
not part of this). Then every job must complete, each run exactly once, and
the jobs completed before the kill must still be completed, untouched. After
each trial the lost server is rebuilt as the standby, so the next trial
fails over the other way.
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from jobqueue import db
from jobqueue.benchmarks.recovery import (
    reset,
    run_counts,
    shown_flags,
    stream,
    timeline,
    worker_argv,
)
from jobqueue.benchmarks.recovery_runs import RUNS_TABLE
from jobqueue.benchmarks.scenarios import steps
from jobqueue.embedded.pair import EmbeddedPair, migrated_pair
from jobqueue.testing import WorkerProcess, in_state, wait_for

_COMPLETED = "SELECT id, completed_at FROM jobqueue_all_jobs WHERE status = 'completed'"


async def failover_trial(pair: EmbeddedPair, *, jobs: int = 1000, job_seconds: float = 0.005,
                         lease: float = 5.0, log_dir: Path | None = None) -> dict[str, Any]:
    """One failover under load; the pair is rebuilt first if an earlier trial
    left it without a standby. Times on the servers' clock: from the kill to
    the end of the promotion (`promoted_s`), the promotion alone
    (`promotion_s`: `pg_promote` to the first moment the standby takes
    writes), from the kill to the first job completed on the new primary
    (`resume_s`); `replication`, how the primary saw its standby just before
    the kill ("sync"); `timeline`, completions around the kill by server."""
    if pair.standby is None:
        await asyncio.to_thread(pair.rebuild)
    assert pair.standby is not None
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="jobqueue-failover-"))
    args = worker_argv(lease, 10)
    url = pair.url()
    watch = await db.connect(url, application_name="jobqueue failover", command_timeout=30)
    # On the standby's own socket: it answers before and after its promotion.
    clock = await db.connect(pair.standby.url(), application_name="jobqueue failover clock",
                             command_timeout=30)
    worker = WorkerProcess(url, log_dir / f"worker-{uuid.uuid4().hex[:8]}.log", *args)
    try:
        await reset(watch)
        await wait_for(lambda: in_state(watch, worker, "active"), timeout=60,
                       message="the worker to be active")
        await stream(watch, jobs, job_seconds, under_way=50)  # past each lane's first job
        before = dict(await watch.fetch(_COMPLETED))
        replication = await asyncio.to_thread(pair.replication)
        watch.terminate()

        pair.kill_primary()
        killed: datetime = await clock.fetchval("SELECT clock_timestamp()")
        promotion = await pair.promote()
        promoted: datetime = await clock.fetchval("SELECT clock_timestamp()")
        first: datetime = await wait_for(lambda: clock.fetchval(
            "SELECT min(completed_at) FROM jobqueue_all_jobs WHERE completed_at > $1", killed),
            timeout=60, interval=0.005, message="the first completion on the new primary")
        await wait_for(lambda: clock.fetchval(
            "SELECT count(*) = $1 FROM jobqueue_all_jobs WHERE status = 'completed'", jobs),
            timeout=120, interval=0.05, message="every job completed")
        after = dict(await clock.fetch(_COMPLETED))
        runs = await run_counts(clock, [], 0)
        return {
            "jobs": jobs, "job_ms": job_seconds * 1000, "lease": lease,
            "replication": replication,
            "flags": shown_flags(args),
            "resume_s": (first - killed).total_seconds(),
            "promoted_s": (promoted - killed).total_seconds(),
            "promotion_s": promotion,
            "after_promotion_s": (first - promoted).total_seconds(),
            "completed_before": len(before),
            "kept_before": sum(after.get(job) == at for job, at in before.items()),
            "completed": runs["completed"], "completed_not_once": runs["completed_not_once"],
            "ran_twice": runs["ran_twice"], "argv": " ".join(args),
            "timeline": [{"server": "old primary" if p["t"] < 0 else "new primary",
                          "t": p["t"], "jobs": p["jobs"]}
                         for p in await timeline(clock, killed, first)]}
    finally:
        worker.close()
        for conn in (watch, clock):
            if not conn.is_closed():
                conn.terminate()


async def failover_series(trials: int, *, jobs: int, job_seconds: float = 0.005,
                          lease: float = 5.0) -> tuple[list[dict[str, Any]],
                                                       list[dict[str, Any]]]:
    """`trials` failovers on one pair (rebuilt between them): a row per
    trial, and each trial's timeline."""
    times, timelines = [], []
    pair = await migrated_pair(RUNS_TABLE)
    try:
        for (trial,) in steps("failover", range(1, trials + 1)):
            result = await failover_trial(pair, jobs=jobs, job_seconds=job_seconds, lease=lease)
            timelines += [{"trial": trial, **point} for point in result.pop("timeline")]
            times.append({"trial": trial, **result})
    finally:
        await asyncio.to_thread(pair.stop)
    return times, timelines
