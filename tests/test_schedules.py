"""Recurring jobs: the calendar (pure), registration's checks, the leader's
chore driven tick by tick on a real database, and real worker processes
sharing one schedule (one job per tick, whoever leads, whoever dies)."""

from __future__ import annotations

import asyncio
import json
import signal
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from jobqueue import HandlerRegistry, db
from jobqueue.schedules import ScheduleSpec, tick_text
from jobqueue.schema.locks import LEADER_KEY, LOCK_CLASS
from jobqueue.schema.queries import queries
from jobqueue.testing import WorkerProcess, wait_for
from jobqueue.worker import WorkerConfig, upkeep
from jobqueue.worker.scheduler import Scheduler
from jobqueue.worker.stats import WorkerStats

TIMEOUT = 30
# The job types of tests/schedule_handlers.py (not imported here: see there).
EVERY_SECOND, HOURLY = "every_second", "hourly"
SCHEDULED = ("--import", "tests.schedule_handlers", "--shared")


def at(iso: str) -> datetime:
    return datetime.fromisoformat(iso).replace(tzinfo=UTC)


async def noop(session: Any, payload: dict[str, Any]) -> None:
    return None


def registry_with(job_type: str, **schedule: Any) -> HandlerRegistry:
    registry = HandlerRegistry()
    registry.register(job_type, **schedule)(noop)
    return registry


async def scheduled_jobs(conn: asyncpg.Connection, job_type: str | None = None
                         ) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT job_type, payload ->> 'tick' AS tick, unique_key, queue, priority FROM jobs"
        " WHERE $1::text IS NULL OR job_type = $1 ORDER BY tick", job_type)


# -- the calendar -----------------------------------------------------------------


@pytest.mark.parametrize(("now", "latest", "following"), [
    ("2026-12-01T10:00:00", "2026-12-01T03:00:00", "2026-12-02T03:00:00"),
    ("2026-12-01T03:00:00", "2026-12-01T03:00:00", "2026-12-02T03:00:00"),  # a tick is its own
    ("2026-12-01T02:59:59.999999", "2026-11-30T03:00:00", "2026-12-01T03:00:00"),
    ("2026-12-01T03:00:00.5", "2026-12-01T03:00:00", "2026-12-02T03:00:00"),
    ("2027-01-01T00:00:00", "2026-12-31T03:00:00", "2027-01-01T03:00:00"),  # across a year
    ("2028-03-01T01:00:00", "2028-02-29T03:00:00", "2028-03-01T03:00:00"),  # a leap day
    # 29 March 2026: Europe's clocks go forward; UTC's do not, nor do its ticks.
    ("2026-03-29T12:00:00", "2026-03-29T03:00:00", "2026-03-30T03:00:00"),
])
def test_the_latest_and_next_tick_of_a_daily_cron(now: str, latest: str, following: str
                                                   ) -> None:
    spec = ScheduleSpec(cron="0 3 * * *")
    assert spec.latest_tick(at(now)) == at(latest)
    assert spec.next_tick(at(now)) == at(following)


def test_cron_is_read_in_utc_whatever_the_zone_of_now() -> None:
    tokyo = datetime.fromisoformat("2026-12-01T11:59:00+09:00")  # 02:59 UTC
    assert ScheduleSpec(cron="0 3 * * *").latest_tick(tokyo) == at("2026-11-30T03:00:00")


def test_cron_fields_and_names() -> None:
    weekdays = ScheduleSpec(cron="30 9 * * mon-fri")
    assert weekdays.latest_tick(at("2026-12-06T12:00:00")) == at("2026-12-04T09:30:00")  # Sun→Fri
    assert ScheduleSpec(cron=" */15  *  * * * ").text == "*/15 * * * *"


@pytest.mark.parametrize(("every", "now", "latest"), [
    (60, "2026-12-01T10:00:59.9", "2026-12-01T10:00:00"),
    (3600, "2026-12-01T10:59:59", "2026-12-01T10:00:00"),
    (86_400, "2026-12-01T10:00:00", "2026-12-01T00:00:00"),
    (1, "2026-12-01T10:00:07.25", "2026-12-01T10:00:07"),
    (7, "1970-01-01T00:00:20", "1970-01-01T00:00:14"),  # aligned to the epoch
])
def test_intervals_tick_on_multiples_of_every_since_the_epoch(every: int, now: str,
                                                               latest: str) -> None:
    spec = ScheduleSpec(every=every)
    assert spec.latest_tick(at(now)) == at(latest)
    assert spec.next_tick(at(now)) == at(latest) + timedelta(seconds=every)
    assert spec.text == f"every {every}s"


def test_a_tick_as_text_is_iso_8601_in_utc() -> None:
    assert tick_text(at("2026-12-01T03:00:00")) == "2026-12-01T03:00:00+00:00"


# -- registration -------------------------------------------------------------------


@pytest.mark.parametrize(("schedule", "message"), [
    ({"cron": "61 * * * *"}, "cron expression '61 * * * *' is not valid: bad minute"),
    ({"cron": "0 24 * * *"}, "is not valid: bad hour"),
    ({"cron": "0 0 31 2 *"}, "is not valid: bad day-of-month"),
    ({"cron": "5-1 * * * *"}, "is not valid: bad minute"),
    ({"cron": "not cron"}, "has 2 field(s); it needs 5 (minute hour day-of-month month "
                           "day-of-week, in UTC)"),
    ({"cron": "* * * * * *"}, "for seconds, use every="),
    ({"cron": ""}, "has 0 field(s)"),
    ({"cron": 5}, "cron must be a string"),
    ({"every": 0}, "every must be between 1 and"),
    ({"every": -1}, "every must be between 1 and"),
    ({"every": 1.5}, "every must be a whole number of seconds, not 1.5"),
    ({"every": True}, "whole number"),
    ({"every": "60"}, "whole number"),
    ({"every": 10**9}, "every must be between 1 and"),
    ({"cron": "0 3 * * *", "every": 60}, "cron= or every=, not both"),
    ({"every": 60, "queue": "no spaces"}, "is not a valid name"),
    ({"every": 60, "priority": 5000}, "priority must be between"),
    ({"queue": "reports"}, "queue and priority apply to scheduled jobs"),
    ({"priority": 1}, "queue and priority apply to scheduled jobs"),
])
def test_a_bad_schedule_is_one_line_at_registration_and_nothing_is_kept(
    schedule: dict[str, Any], message: str
) -> None:
    registry = HandlerRegistry()
    with pytest.raises(ValueError) as raised:
        registry.register("nightly", **schedule)(noop)
    text = str(raised.value)
    assert message in text and "\n" not in text and len(text) < 200
    assert "nightly" not in registry and not registry.schedules


def test_registration_keeps_the_schedule_beside_the_handler() -> None:
    registry = registry_with("nightly", cron="0 3 * * *", queue="reports", priority=5)
    registry.register("plain")(noop)
    assert "nightly" in registry and "plain" in registry
    assert dict(registry.schedules) == {
        "nightly": ScheduleSpec(cron="0 3 * * *", queue="reports", priority=5)}
    registry.register("nightly")(noop)  # registered again without one: no longer recurs
    assert not registry.schedules
    registry.register("nightly", every=60)(noop)
    registry.remove("nightly")
    assert not registry.schedules and "nightly" not in registry


# -- the leader's chore, tick by tick ----------------------------------------------------


async def test_a_new_schedule_waits_for_its_next_tick(conn: asyncpg.Connection) -> None:
    """A brand-new daily schedule registered at 10:00 does not run for the
    03:00 that has just gone by: its first job is the next day's 03:00."""
    scheduler = Scheduler(registry_with("nightly", cron="0 3 * * *").schedules)
    assert await scheduler.run_once(conn, now=at("2026-12-01T10:00:00")) == 0
    row = await conn.fetchrow("SELECT schedule, last_tick FROM jobqueue_schedules")
    assert dict(row) == {"schedule": "0 3 * * *", "last_tick": at("2026-12-01T03:00:00")}
    assert await scheduler.run_once(conn, now=at("2026-12-02T02:59:59.9")) == 0
    assert await scheduled_jobs(conn) == []

    assert await scheduler.run_once(conn, now=at("2026-12-02T03:00:00")) == 1
    assert await scheduler.run_once(conn, now=at("2026-12-02T03:00:00.6")) == 0
    [job] = await scheduled_jobs(conn)
    assert dict(job) == {"job_type": "nightly", "tick": "2026-12-02T03:00:00+00:00",
                         "unique_key": "schedule:nightly:2026-12-02T03:00:00+00:00",
                         "queue": "default", "priority": 0}
    assert await conn.fetchval("SELECT last_tick FROM jobqueue_schedules") == job_tick(job)


def job_tick(job: asyncpg.Record) -> datetime:
    return datetime.fromisoformat(job["tick"])


async def test_on_the_database_clock_the_first_job_comes_at_the_next_tick(
    conn: asyncpg.Connection
) -> None:
    leader = upkeep.Leader(WorkerConfig(), conn, 1, WorkerStats(), asyncio.Lock(),
                           schedules=registry_with("often", every=1).schedules)
    assert (await leader.run_once())["scheduled"] == 0
    registered = await conn.fetchval("SELECT last_tick FROM jobqueue_schedules")
    now = await conn.fetchval("SELECT now()")
    assert now - timedelta(seconds=2) < registered <= now  # the second it registered in
    assert await scheduled_jobs(conn) == []
    await wait_for(lambda: _scheduled(leader), timeout=TIMEOUT, message="the next tick's job")
    [job] = await scheduled_jobs(conn)
    assert job_tick(job) > registered


async def _scheduled(leader: upkeep.Leader) -> bool:
    return bool((await leader.run_once())["scheduled"])


async def test_a_failing_schedule_pass_holds_up_no_other_chore(
    conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    await conn.execute("INSERT INTO jobs (job_type, status, completed_at) "
                       "VALUES ('old', 'completed', now() - interval '30 days')")
    leader = upkeep.Leader(WorkerConfig(), conn, 1, WorkerStats(), asyncio.Lock(),
                           schedules=registry_with("often", every=1).schedules)

    async def timed_out(*args: object, **kwargs: object) -> int:
        raise asyncpg.QueryCanceledError("canceling statement due to statement timeout")

    monkeypatch.setattr(leader.scheduler, "run_once", timed_out)
    assert await leader.run_once() == {"leader": True, "rescued": 0, "scheduled": 0,
                                       "archived": 1, "expired": 0}


async def test_ticks_missed_while_nothing_ran_make_one_job_for_the_latest(
    conn: asyncpg.Connection
) -> None:
    specs = registry_with("minutely", every=60, queue="reports", priority=3).schedules
    assert await Scheduler(specs).run_once(conn, now=at("2026-12-01T10:00:30")) == 0
    # Every worker stops for ten minutes; the next leader starts afresh.
    later = Scheduler(specs)
    assert await later.run_once(conn, now=at("2026-12-01T10:10:30")) == 1
    assert await later.run_once(conn, now=at("2026-12-01T10:10:59")) == 0
    assert [(j["tick"], j["queue"], j["priority"]) for j in await scheduled_jobs(conn)] == [
        ("2026-12-01T10:10:00+00:00", "reports", 3)]


async def test_a_changed_schedule_keeps_its_last_tick(conn: asyncpg.Connection) -> None:
    await Scheduler(registry_with("nightly", cron="0 3 * * *").schedules).run_once(
        conn, now=at("2026-12-01T03:30:00"))
    before = await conn.fetchrow("SELECT last_tick, updated_at FROM jobqueue_schedules")
    moved = Scheduler(registry_with("nightly", cron="0 4 * * *").schedules)
    # Its latest tick (04:00 the day before) is older than the last one run: no job.
    assert await moved.run_once(conn, now=at("2026-12-01T03:30:00")) == 0
    row = await conn.fetchrow("SELECT schedule, last_tick, updated_at FROM jobqueue_schedules")
    assert row["schedule"] == "0 4 * * *" and row["last_tick"] == before["last_tick"]
    assert row["updated_at"] >= before["updated_at"]
    assert await moved.run_once(conn, now=at("2026-12-01T04:00:00")) == 1


async def test_a_leader_without_the_schedule_does_not_fire_it(conn: asyncpg.Connection) -> None:
    await Scheduler(registry_with("nightly", cron="0 3 * * *").schedules).run_once(
        conn, now=at("2026-12-01T10:00:00"))
    other = Scheduler(registry_with("elsewhere", every=3600).schedules)
    assert await other.run_once(conn, now=at("2026-12-05T10:00:00")) == 0
    assert [j["job_type"] for j in await scheduled_jobs(conn)] == []
    assert await conn.fetchval("SELECT last_tick FROM jobqueue_schedules "
                               "WHERE job_type = 'nightly'") == at("2026-12-01T03:00:00")


@pytest.mark.parametrize("first_commits", [True, False])
async def test_two_leaders_firing_one_tick_at_once_make_one_job(
    conn: asyncpg.Connection, db_url: str, first_commits: bool
) -> None:
    """A leader change in mid-tick: the old leader's statement is still open
    when the new one fires the same tick. The second waits for the first
    one's row; committed, it finds the tick taken; rolled back, it takes it."""
    await Scheduler(registry_with("often", every=1).schedules).run_once(
        conn, now=at("2026-12-01T10:00:00"))
    fire = {"job_types": ["often"], "ticks": ["2026-12-01T10:00:01+00:00"],
            "queues": ["default"], "priorities": [0]}
    old, new = await db.connect(db_url), await db.connect(db_url)
    try:
        tx = old.transaction()
        await tx.start()
        assert len(await queries["schedule_fire"].fetch(old, **fire)) == 1
        second = asyncio.ensure_future(queries["schedule_fire"].fetch(new, **fire))
        await wait_for(lambda: _waiting_for_a_lock(conn), timeout=TIMEOUT,
                       message="the second leader to wait for the row")
        # Committed, or undone (the old leader's connection died under it).
        await (tx.commit() if first_commits else tx.rollback())
        assert len(await second) == (0 if first_commits else 1)
    finally:
        await old.close()
        await new.close()
    jobs = await scheduled_jobs(conn)
    assert [j["tick"] for j in jobs] == ["2026-12-01T10:00:01+00:00"]


async def test_each_guard_alone_keeps_a_tick_to_one_job(conn: asyncpg.Connection) -> None:
    await Scheduler(registry_with("often", every=1).schedules).run_once(
        conn, now=at("2026-12-01T10:00:00"))
    fire = {"job_types": ["often"], "ticks": ["2026-12-01T10:00:01+00:00"],
            "queues": ["default"], "priorities": [0]}
    assert len(await queries["schedule_fire"].fetch(conn, **fire)) == 1
    # The tick's job already ran (its key is free again): last_tick refuses it.
    await conn.execute("UPDATE jobs SET status = 'completed'")
    assert await queries["schedule_fire"].fetch(conn, **fire) == []
    # The row set back (by hand), the job waiting again: its unique key refuses it.
    await conn.execute("UPDATE jobs SET status = 'pending'")
    await conn.execute("UPDATE jobqueue_schedules SET last_tick = last_tick - interval '1s'")
    assert await queries["schedule_fire"].fetch(conn, **fire) == []
    assert len(await scheduled_jobs(conn)) == 1


async def _waiting_for_a_lock(conn: asyncpg.Connection) -> bool:
    return bool(await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND datname = current_database()"))


# -- real worker processes ---------------------------------------------------------------


async def _ticks(conn: asyncpg.Connection, job_type: str = EVERY_SECOND
                 ) -> dict[datetime, int]:
    """Jobs per tick, as the database has them."""
    rows = await conn.fetch("SELECT payload ->> 'tick' AS tick, count(*) AS n FROM jobs "
                            "WHERE job_type = $1 GROUP BY 1", job_type)
    return {datetime.fromisoformat(r["tick"]): r["n"] for r in rows}


async def _at_least_ticks(conn: asyncpg.Connection, n: int, after: datetime | None = None
                          ) -> bool:
    return sum(1 for tick in await _ticks(conn) if after is None or tick > after) >= n


async def _shared_workers(conn: asyncpg.Connection, n: int) -> bool:
    return await conn.fetchval(
        "SELECT count(*) FROM jobqueue_workers WHERE state = 'shared'") >= n


async def _leader_pid(conn: asyncpg.Connection) -> int | None:
    """The process that holds the maintenance leader's lock, if any: the lock's
    backend names the worker id, the worker's row its host:pid."""
    name = await conn.fetchval(
        "SELECT w.name FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid "
        "JOIN jobqueue_workers AS w ON a.application_name LIKE 'jobqueue worker ' || w.id || ' %'"
        " WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1 AND l.objid = $2"
        " AND l.objsubid = 2 AND l.database = "
        "(SELECT oid FROM pg_database WHERE datname = current_database())",
        LOCK_CLASS, LEADER_KEY)
    return int(name.rsplit(":", 1)[1]) if name else None


def _assert_one_job_per_tick(ticks: dict[str, int], keys: list[asyncpg.Record]) -> None:
    assert all(n == 1 for n in ticks.values()), ticks
    assert all(k["unique_key"] == f"schedule:{EVERY_SECOND}:{k['tick']}" for k in keys)
    assert len(keys) == len(ticks)


async def test_three_shared_workers_enqueue_each_tick_once(
    spawn_worker: Any, conn: asyncpg.Connection
) -> None:
    started = await conn.fetchval("SELECT now()")
    for _ in range(3):
        spawn_worker(*SCHEDULED)
    await wait_for(lambda: _shared_workers(conn, 3), timeout=TIMEOUT,
                   message="three shared workers")
    await wait_for(lambda: _at_least_ticks(conn, 4), timeout=TIMEOUT, message="four ticks")
    ticks = await _ticks(conn)
    assert len(ticks) >= 4
    _assert_one_job_per_tick(ticks, await scheduled_jobs(conn, EVERY_SECOND))
    # The hourly schedule was registered by the same workers: its first tick
    # is the next hour's, so nothing for an hour that began before they did.
    assert all(tick > started for tick in await _ticks(conn, HOURLY))
    assert await conn.fetchval("SELECT count(*) FROM jobqueue_schedules") == 2


async def test_a_killed_leader_is_replaced_and_no_tick_is_doubled(
    spawn_worker: Any, conn: asyncpg.Connection
) -> None:
    workers = {w.pid: w for w in (spawn_worker(*SCHEDULED) for _ in range(3))}
    await wait_for(lambda: _shared_workers(conn, 3), timeout=TIMEOUT,
                   message="three shared workers")
    await wait_for(lambda: _at_least_ticks(conn, 2), timeout=TIMEOUT, message="two ticks")
    leader = await wait_for(lambda: _leader_pid(conn), timeout=TIMEOUT, message="a leader")
    workers[leader].signal(signal.SIGKILL)
    assert await workers[leader].wait(TIMEOUT) == -signal.SIGKILL
    killed_at = await conn.fetchval("SELECT now()")

    async def another_leader() -> bool:
        pid = await _leader_pid(conn)
        return pid is not None and pid != leader

    await wait_for(another_leader, timeout=TIMEOUT, message="another worker to lead")
    await wait_for(lambda: _at_least_ticks(conn, 3, after=killed_at), timeout=TIMEOUT,
                   message="three ticks after the kill")
    ticks = await _ticks(conn)
    assert sum(1 for t in ticks if t < killed_at) >= 2
    _assert_one_job_per_tick(ticks, await scheduled_jobs(conn, EVERY_SECOND))


async def test_a_worker_starting_after_missed_ticks_runs_the_latest_once(
    spawn_worker: Any, conn: asyncpg.Connection
) -> None:
    # The hourly schedule last ran five hours ago: four ticks went by unrun.
    start_hour = await conn.fetchval("SELECT date_trunc('hour', now())")
    await conn.execute(
        "INSERT INTO jobqueue_schedules (job_type, schedule, last_tick) "
        "VALUES ($1, 'every 3600s', $2)", HOURLY, start_hour - timedelta(hours=5))
    worker: WorkerProcess = spawn_worker(*SCHEDULED)
    await wait_for(lambda: _at_least_ticks(conn, 1), timeout=TIMEOUT,
                   message="the leader's first tick")
    first = max(await _ticks(conn))
    # Two more passes of the leader (two more every-second ticks): time for
    # any further job of the missed hours to have come.
    await wait_for(lambda: _at_least_ticks(conn, 2, after=first), timeout=TIMEOUT,
                   message="two more ticks")
    end_hour = await conn.fetchval("SELECT date_trunc('hour', now())")
    # One job, for the latest hour; two only if an hour began during the test.
    hours = await _ticks(conn, HOURLY)
    assert end_hour in hours and set(hours) <= {start_hour, end_hour}, worker.log()
    assert all(n == 1 for n in hours.values())
    assert await conn.fetchval("SELECT last_tick FROM jobqueue_schedules WHERE job_type = $1",
                               HOURLY) == end_hour
    payload = await conn.fetchval("SELECT payload::text FROM jobs WHERE job_type = $1 "
                                  "ORDER BY created_at DESC LIMIT 1", HOURLY)
    assert json.loads(payload) == {"tick": tick_text(end_hour)}
