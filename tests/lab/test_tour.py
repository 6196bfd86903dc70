"""Lesson 07's helpers (jobqueue.lab.tour) against the real database."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import matplotlib
import pandas as pd
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from jobqueue import JobRunner, RetryPolicy, enqueue, enqueue_many, handlers
from jobqueue.lab import slow_jobs, tour
from jobqueue.schema.models import JobStatus
from jobqueue.testing import drain, wait_for
from jobqueue.worker.upkeep import rescue

matplotlib.use("Agg")

NO_WAIT = RetryPolicy(base=0, jitter=0)


def test_registry_has_the_examples_and_the_lab_handlers() -> None:
    registry = tour.lesson_registry()
    assert list(registry) == ["broken", "flaky", "gated", "generate_report",
                              "process_payment", "send_email", "slow_write", "verbose"]
    assert "flaky" not in handlers  # the global registry is left alone


def test_short_error_keeps_the_driver_class_and_the_message() -> None:
    wrapped = ("IntegrityError: (sqlalchemy.dialects.postgresql.asyncpg.UniqueViolationError) "
               'duplicate key value violates unique constraint "k"\n[SQL: INSERT …]')
    assert tour.short_error(wrapped, width=200) == (
        'UniqueViolationError: duplicate key value violates unique constraint "k"')
    assert tour.short_error("ValueError: bad") == "ValueError: bad"
    assert tour.short_error("x" * 100, width=10) == "x" * 9 + "…"
    assert tour.short_error(None) is None


async def test_only_committed_jobs_are_seen_and_announced(engine: AsyncEngine, conn) -> None:
    heard = await tour.listen(conn)
    async with engine.connect() as c:
        await enqueue(c, "send_email", {"to": "a@example.com"})
        assert await tour.count_jobs(conn) == 0
        await c.rollback()
    async with engine.connect() as c:
        await enqueue(c, "send_email", {"to": "a@example.com"})
        await c.commit()
    assert await tour.heard_count(heard, at_least=1) == 1
    assert await tour.count_jobs(conn) == 1
    assert await tour.count_jobs(conn, "other") == 0
    table = await tour.jobs_table(conn)
    assert table.to_dict("records") == [{
        "job_type": "send_email", "payload": '{"to": "a@example.com"}', "status": "pending",
        "retry_count": 0, "max_retries": 3, "history": 0, "error": "", "result": ""}]


async def test_retries_follow_celery_and_the_timeline_shows_them(
    engine: AsyncEngine, db_url: str, conn
) -> None:
    async with AsyncSession(engine) as s, s.begin():
        jobs = {"flaky": await enqueue(s, "flaky", {"fail_times": 2}, max_retries=3),
                "broken": await enqueue(s, "broken", {"invoice": "X"}, max_retries=3)}
    report = await drain(db_url, registry=tour.lesson_registry(), retry_policy=NO_WAIT)

    assert tour.report_counts(report) == {"processed": 1, "failed": 1, "retried": 5,
                                          "rescued": 0, "error_rate": round(6 / 7, 4)}
    assert await tour.outcome(conn, jobs["flaky"]) == {
        "runs": 3, "retry_count": 2, "status": "completed"}
    assert await tour.outcome(conn, jobs["broken"]) == {
        "runs": 4, "retry_count": 3, "status": "failed"}
    table = await tour.jobs_table(conn, jobs)
    assert list(table["job"]) == ["flaky", "broken"]
    assert list(table["history"]) == [2, 4]
    # A completed job has no error_message; its failures are in the history.
    assert list(table["error"]) == ["", "ValueError: invoice 'X' is malformed"]

    timeline = await tour.attempt_timeline(conn, jobs, NO_WAIT)
    assert list(zip(timeline["job"], timeline["attempt"], timeline["outcome"], strict=True)) == [
        ("flaky", 1, "failed"), ("flaky", 2, "failed"), ("flaky", 3, "completed"),
        ("broken", 1, "failed"), ("broken", 2, "failed"), ("broken", 3, "failed"),
        ("broken", 4, "failed")]
    assert timeline["seconds"].min() == 0
    assert tour.backoff_respected(timeline)
    assert tour.plot_timeline(timeline).axes


def test_backoff_respected_catches_an_early_retry() -> None:
    early = pd.DataFrame({"gap": [None, 0.1], "backoff": [None, 0.2]})
    on_time = pd.DataFrame({"gap": [None, 0.25], "backoff": [None, 0.2]})
    assert not tour.backoff_respected(early)
    assert tour.backoff_respected(on_time)
    assert not tour.backoff_respected(pd.DataFrame({"gap": [None], "backoff": [None]}))


async def test_a_retry_is_booked_exactly_one_backoff_after_the_failure(
    engine: AsyncEngine, db_url: str, conn
) -> None:
    async with AsyncSession(engine) as s, s.begin():
        job_id = await enqueue(s, "broken", {}, max_retries=1)
    # A backoff no drain outlasts: a burst drain runs what falls due while it
    # runs, so with a short one a slow machine would see the retry run too.
    await drain(db_url, registry=tour.lesson_registry(),
                retry_policy=RetryPolicy(base=30, jitter=0))
    assert await tour.status_counts(conn) == {"retrying": 1}
    assert await tour.retry_scheduled_after(conn, job_id) == 30


async def test_error_message_and_history_keep_2000_characters(
    engine: AsyncEngine, db_url: str, conn
) -> None:
    async with AsyncSession(engine) as s, s.begin():
        job_id = await enqueue(s, "verbose", {}, max_retries=1)
    await drain(db_url, registry=tour.lesson_registry(), retry_policy=NO_WAIT)
    assert len(tour.VERBOSE_ERROR) > 2000
    assert await tour.error_lengths(conn, job_id) == {
        "error_message": 2000, "history[0]": 2000, "history[1]": 2000}


async def test_a_gated_job_is_seen_processing(engine: AsyncEngine, db_url: str, conn) -> None:
    tour.close_gate()
    runner = JobRunner(db_url, registry=tour.lesson_registry(), install_signal_handlers=False)
    task = asyncio.create_task(runner.run())
    try:
        async with AsyncSession(engine) as s, s.begin():
            job_id = await enqueue(s, "gated", {})
        assert await tour.wait_status(conn, job_id, "processing") == "processing"
        tour.open_gate()
        assert await tour.wait_status(conn, job_id, "completed") == "completed"
    finally:
        tour.open_gate()
        runner.stop()
        report = await asyncio.wait_for(task, 30)
    assert tour.report_counts(report)["processed"] == 1
    assert set(tour.report_timings(report)) == {
        "elapsed_seconds", "batches", "throughput_per_sec", "handler_ms", "latency_ms"}


async def test_summary_counts_leave_timings_out(engine: AsyncEngine, db_url: str, conn) -> None:
    from jobqueue.ops.status import queue_summary

    async with engine.begin() as c:
        await enqueue_many(c, "send_email", [{"to": "a@b.c"}, {"to": "d@e.f"}])
        await enqueue(c, "broken", {}, max_retries=0)
    await drain(db_url, registry=tour.lesson_registry())
    summary = await queue_summary(conn)
    counts = tour.summary_counts(summary)
    assert counts["counts"]["completed"] == 2 and counts["counts"]["failed"] == 1
    assert counts["recent failed attempts"] == 1 and counts["workers"] == 0
    assert counts["error_rate"] == round(1 / 3, 4)
    assert set(tour.summary_timings(summary)) == {"throughput_per_sec", "latency_ms",
                                                   "run_time_ms"}


def test_state_machine_lists_every_status_and_both_ways_through() -> None:
    statuses = {s for t in tour.TRANSITIONS for s in (t.src, t.dst)}
    assert statuses == set(JobStatus)
    claimed = {(t.src, t.dst) for t in tour.TRANSITIONS if not t.quick}
    quick = {(t.src, t.dst) for t in tour.TRANSITIONS if t.quick}
    # Claimed jobs go through processing; a quick batch takes a waiting job
    # (`take`: pending or retrying) straight to what `complete` and `fail` write.
    assert all("processing" in pair for pair in claimed)
    assert quick == {(src, dst) for src in ("pending", "retrying")
                     for dst in ("completed", "retrying", "failed")}
    assert "processing" not in {s for pair in quick for s in pair}
    assert tour.plot_state_machine().axes


@pytest.fixture
async def crew(db_url: str, conn, tmp_path: Path) -> AsyncIterator[tour.Crew]:
    """A crew of real worker processes in the test's database (with
    `lab_writes`), every process ended when the test ends, however it ends."""
    await slow_jobs.create_tables(conn)
    crew = tour.Crew(db_url, tmp_path)
    yield crew
    crew.close()


async def test_crew_takeover_after_sigkill(engine: AsyncEngine, conn, crew: tour.Crew) -> None:
    crew.start("first")
    await crew.wait_states(conn, {"first": "active"})
    crew.start("second")
    await crew.wait_states(conn, {"first": "active", "second": "standby"})
    assert await crew.active_lock(conn) == {"holds": ["first"], "waits": ["second"]}

    async with engine.begin() as c:
        ids = await enqueue_many(c, "slow_write", [{"seconds": 0.005}] * 150)
    assert await tour.wait_completed(conn, ids, at_least=20) >= 20
    killed_at = await crew.signal(conn, "first", signal.SIGKILL)
    await crew.wait_states(conn, {"second": "active"})
    assert (await crew.table(conn)).to_dict("records") == [
        {"worker": "second", "mode": "exclusive", "state": "active"}]
    await tour.wait_completed(conn, ids, at_least=150)
    assert await tour.jobs_health(conn, ids) == {
        "enqueued": 150, "found": 150, "completed": 150, "processing": 0, "pending": 0,
        "retrying": 0, "failed": 0}

    done = await tour.completions(conn, crew, killed_at, ids)
    by = tour.completed_by(done)
    assert set(by) == {"first", "second"} and sum(by.values()) == 150
    assert tour.completed_after(done, "first") == 0
    assert tour.recovery_seconds(done, "second") > 0
    assert tour.plot_completions(done, "second").axes
    ended = crew.close()
    assert ended == {"first": "had exited (-9)", "second": "killed now"}
    assert crew.close() == {"first": "had exited (-9)", "second": "had exited (-9)"}


#: What the jobs a dead worker held show once a standby put them back and ran
#: them: completed by it, no attempt counted, their database work done once.
RESCUED_AND_DONE_ONCE = {"status": ["completed"], "retry_count": [0], "worker": ["second"],
                         "rows in lab_writes": [1], "attempts written": [1]}


@pytest.mark.parametrize("death", ["killed", "hung"])
async def test_a_dead_worker_s_claimed_jobs_are_put_back_and_done_once(
    engine: AsyncEngine, conn, crew: tour.Crew, death: str
) -> None:
    """first (claiming every batch) is frozen while it holds claimed jobs,
    then killed (SIGKILL) or left hung until second's lease fences it."""
    crew.start("first", *tour.CLAIM_FIRST)
    await crew.wait_states(conn, {"first": "active"})
    crew.start("second", *tour.CLAIM_FIRST, "--lease", "1.5")
    await crew.wait_states(conn, {"first": "active", "second": "standby"})
    async with engine.begin() as c:
        ids = await enqueue_many(c, "slow_write", [{"seconds": 0.005}] * 200)
    await tour.wait_completed(conn, ids, at_least=20)
    held, _ = await tour.catch_claimed(conn, crew, "first", ids)
    assert held, "there must be something to rescue"
    assert await tour.fate(conn, crew, held) == {
        "status": ["processing"], "retry_count": [0], "worker": ["first"],
        "rows in lab_writes": [0], "attempts written": []}

    if death == "killed":
        await crew.signal(conn, "first", signal.SIGKILL)
    await crew.wait_states(conn, {"second": "active"})
    assert bool(crew.log_lines("second", "fenced off worker")) == (death == "hung")
    assert await crew.wait_rescued("second", len(held)) == len(held)
    await tour.wait_completed(conn, ids, at_least=200)
    assert await tour.fate(conn, crew, held) == RESCUED_AND_DONE_ONCE
    assert (await tour.fate(conn, crew, ids))["rows in lab_writes"] == [1]
    ended = crew.close()
    assert ended == {"first": "had exited (-9)" if death == "killed" else "killed now",
                     "second": "killed now"}


async def test_a_killed_quick_batch_leaves_nothing_to_put_back_and_runs_alone_next(
    engine: AsyncEngine, db_url: str, conn, crew: tour.Crew
) -> None:
    crew.start("first")  # quick batches, the default
    await crew.wait_states(conn, {"first": "active"})
    async with engine.begin() as c:
        ids = await enqueue_many(c, "slow_write", [{"seconds": 0.005}] * 300)
    await tour.wait_completed(conn, ids, at_least=30)
    taken, _ = await tour.catch_quick_batch(conn, crew, "first", ids)
    assert taken, "the freeze must catch a quick batch under way"
    assert await tour.held_by(conn, crew, "first") == []
    await crew.signal(conn, "first", signal.SIGKILL)
    await tour.wait_released(conn, ids)
    # Its ledger rows name its batches (the freeze waited for them: a lane
    # caught between its take and its ledger write leaves nothing to mark):
    # each job is marked to run alone, none blamed. The lane's backend
    # ending (its locks released) does not mean the control connection's
    # has: until that one ends too, its liveness lock says the worker lives
    # and a rescue leaves its batches alone (failed once under CI's load:
    # 0 marked). A leader rescues every tick; here, until one does.
    marked = await wait_for(lambda: rescue(conn), timeout=30,
                            message="a rescue that finds the killed worker gone")
    assert 0 < marked <= len(taken)
    assert await tour.fate(conn, crew, taken) == {
        "status": ["pending"], "retry_count": [0], "worker": ["nobody"],
        "rows in lab_writes": [0], "attempts written": []}
    assert await conn.fetchval("SELECT count(*) FILTER (WHERE run_alone) FROM jobs "
                               "WHERE id = ANY($1)", taken) == marked
    await drain(db_url, registry=tour.lesson_registry())
    done = await tour.fate(conn, crew, ids)
    assert done["status"] == ["completed"] and done["rows in lab_writes"] == [1]

