"""jobqueue.lab.savepoints: the facts lesson 05 teaches, checked against the
real PostgreSQL (so a lesson that stopped being true fails here too)."""

from __future__ import annotations

import asyncpg
import pytest
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from jobqueue import HandlerRegistry, enqueue_many
from jobqueue.lab import examples, savepoints
from jobqueue.testing import drain


@pytest.fixture
async def accounts(conn: asyncpg.Connection) -> asyncpg.Connection:
    await savepoints.reset_accounts(conn, {1: 100, 2: 50})
    return conn


def answers(frame) -> list[str]:  # type: ignore[no-untyped-def]
    return list(frame["answer"])


async def test_an_error_without_savepoint_turns_commit_into_rollback(accounts) -> None:
    steps = await savepoints.run_steps(accounts, [
        "BEGIN", *savepoints.pay("p-1", 1, -30), *savepoints.pay("p-2", 2, -200),
        *savepoints.pay("p-3", 2, 30), "COMMIT"])
    assert answers(steps) == [
        "BEGIN", "UPDATE 1", "INSERT 0 1", "CheckViolationError",
        "InFailedSQLTransactionError", "InFailedSQLTransactionError",
        "InFailedSQLTransactionError", "ROLLBACK"]
    assert list(steps["in transaction"])[-1] is False
    assert await savepoints.balances(accounts) == {1: "100.00", 2: "50.00"}
    assert await savepoints.payments(accounts) == []


async def test_rollback_to_savepoint_undoes_only_its_own_work(accounts) -> None:
    steps = await savepoints.run_steps(accounts, [
        "BEGIN",
        "SAVEPOINT p1", *savepoints.pay("p-1", 1, -30), "RELEASE SAVEPOINT p1",
        "SAVEPOINT p2", *savepoints.pay("p-2", 2, -200), "ROLLBACK TO SAVEPOINT p2",
        "SAVEPOINT p3", *savepoints.pay("p-3", 2, 30), "RELEASE SAVEPOINT p3",
        "COMMIT"])
    assert answers(steps)[-1] == "COMMIT"
    assert await savepoints.balances(accounts) == {1: "70.00", 2: "80.00"}
    assert await savepoints.payments(accounts) == ["p-1", "p-3"]


async def test_nested_savepoints(accounts) -> None:
    steps = await savepoints.run_steps(accounts, [
        "BEGIN", "SAVEPOINT o", *savepoints.pay("p-10", 1, -10),
        "SAVEPOINT i", *savepoints.pay("p-20", 1, -20),
        "ROLLBACK TO SAVEPOINT i", "SELECT balance FROM demo_users WHERE id = 1",
        "ROLLBACK TO SAVEPOINT o", "SELECT balance FROM demo_users WHERE id = 1",
        "ROLLBACK TO SAVEPOINT i", "ROLLBACK TO SAVEPOINT o", "COMMIT"])
    assert [v for v in steps["value"] if v != ""] == ["90.00", "100.00"]
    assert answers(steps)[-3:] == ["InvalidSavepointSpecificationError", "ROLLBACK", "COMMIT"]


async def test_release_after_an_error_in_the_savepoint_fails(accounts) -> None:
    steps = await savepoints.run_steps(accounts, [
        "BEGIN", "SAVEPOINT h", savepoints.pay("p-2", 2, -200)[0], "RELEASE SAVEPOINT h",
        "ROLLBACK TO SAVEPOINT h", "COMMIT"])
    assert answers(steps) == ["BEGIN", "SAVEPOINT", "CheckViolationError",
                              "InFailedSQLTransactionError", "ROLLBACK", "COMMIT"]


async def test_begin_nested_rolls_back_to_its_savepoint(accounts, engine: AsyncEngine) -> None:
    sessions = async_sessionmaker(engine)
    with savepoints.sql_trace(engine) as trace:
        async with sessions() as session, session.begin():
            await savepoints.session_pay(session, "p-1", 1, -30)
            with pytest.raises(IntegrityError) as caught:
                async with session.begin_nested():
                    await savepoints.session_pay(session, "p-2", 2, -200)
            assert savepoints.pg_error(caught.value) == "CheckViolationError"
    assert trace[0] == "BEGIN" and trace[-1] == "COMMIT"
    assert "SAVEPOINT sa_savepoint_1" in trace
    assert "ROLLBACK TO SAVEPOINT sa_savepoint_1" in trace
    assert await savepoints.balances(accounts) == {1: "70.00", 2: "50.00"}


async def test_sql_trace_names_jobqueue_queries_and_a_swallowed_error_fails_the_job(
    accounts, db_url: str, engine: AsyncEngine
) -> None:
    registry = HandlerRegistry()
    registry.add("process_payment", examples.process_payment)
    registry.add("swallowing_payment", savepoints.swallowing_payment)
    async with engine.begin() as c:
        await enqueue_many(c, "process_payment",
                           [{"payment_id": "p-1", "user_id": 1, "amount": -30}], max_retries=0)
        await enqueue_many(c, "swallowing_payment",
                           [{"payment_id": "p-2", "user_id": 2, "amount": -200}], max_retries=0)
    with savepoints.sql_trace() as trace:
        await drain(db_url, registry=registry)
    assert "claim  (jobqueue/schema/queries.sql)" in trace
    assert "complete_claimed  (jobqueue/schema/queries.sql)" in trace
    jobs = await savepoints.job_outcomes(accounts)
    assert list(zip(jobs["payment_id"], jobs["status"], jobs["error"], strict=True)) == [
        ("p-1", "completed", ""), ("p-2", "failed", "SwallowedDatabaseError")]
    assert await savepoints.balances(accounts) == {1: "70.00", 2: "50.00"}


def test_error_kind() -> None:
    assert savepoints.error_kind(None) == ""
    assert savepoints.error_kind(
        "IntegrityError: (sqlalchemy.dialects.postgresql.asyncpg.UniqueViolationError) dup"
    ) == "UniqueViolationError"
    assert savepoints.error_kind("SwallowedDatabaseError: the handler …") == (
        "SwallowedDatabaseError")
    assert savepoints.pay("o'k", 1, 5)[1].endswith("VALUES ('o''k', 1, 5)")


@pytest.fixture
async def others(db_url: str):  # type: ignore[no-untyped-def]
    """Two more connections: a reader and an observer."""
    from jobqueue import db

    pair = [await db.connect(db_url, application_name=name) for name in ("reader", "observer")]
    yield pair
    for c in pair:
        await c.close()


async def test_the_subtransaction_cache_overflows_past_64(accounts, others) -> None:
    _, observer = others
    cache = await savepoints.cache_by_savepoint(accounts, observer, marks=(1, 64, 65))
    assert list(cache.index) == [
        "savepoints that only read: 100", "savepoints that wrote: 1", "savepoints that wrote: 64",
        "savepoints that wrote: 65", "ROLLBACK TO SAVEPOINT s10", "after COMMIT"]
    assert list(cache["cached subxids"]) == [0, 1, 64, 64, 9, 0]
    assert list(cache["overflowed"]) == [False, False, False, True, True, False]


# Serial: pg_stat_slru counts the whole cluster's pg_subtrans reads, and
# while the writer's subtransaction cache is overflowed, every snapshot on
# the cluster is too, so a test in another database checking recent rows
# adds reads here (a clean-clone CI run read 51.1 per row against 34.0).
@pytest.mark.serial
async def test_an_overflowed_writer_costs_readers_pg_subtrans_reads(accounts, others) -> None:
    reader, observer = others
    fits = await savepoints.reader_cost(accounts, reader, observer, savepoints=64, rows=100)
    released = await savepoints.reader_cost(accounts, reader, observer, savepoints=65, rows=100,
                                            nested=False)
    nested = await savepoints.reader_cost(accounts, reader, observer, savepoints=65, rows=100)
    assert (fits["overflowed"], released["overflowed"], nested["overflowed"]) == (
        False, True, True)
    per_row = "pg_subtrans reads per row, 1st count"
    assert fits[per_row] == fits["2nd count"] == 0.0
    assert released[per_row] == released["2nd count"] == 2.0  # subxact -> top -> none
    # the row of the k-th nested savepoint walks k + 1 parents: (2 + … + 66) / 65
    assert nested[per_row] == nested["2nd count"] == sum(range(2, 67)) / 65 == 34.0
    assert await accounts.fetchval("SELECT count(*) FROM lesson_rows") == 0  # rolled back


async def test_a_savepoint_costs_time_and_changes_nothing(accounts) -> None:
    for wrapped in (False, True):
        assert await savepoints.payments_timed(accounts, 20, savepoints=wrapped) > 0
    assert await savepoints.balances(accounts) == {1: "100.00", 2: "50.00"}


async def test_rollback_to_savepoint_releases_transaction_locks_not_session_ones(
    accounts,
) -> None:
    steps = await savepoints.run_steps(accounts, [
        "BEGIN", "SAVEPOINT s", "SELECT pg_try_advisory_xact_lock(5, 1)",
        "SELECT pg_try_advisory_lock(5, 2)", savepoints.HELD_LOCKS,
        "ROLLBACK TO SAVEPOINT s", savepoints.HELD_LOCKS,
        "SAVEPOINT t", "SELECT pg_try_advisory_xact_lock(5, 3)", "RELEASE SAVEPOINT t",
        savepoints.HELD_LOCKS, "COMMIT", savepoints.HELD_LOCKS,
        "SELECT pg_advisory_unlock(5, 2)", savepoints.HELD_LOCKS])
    held = [v for s, v in zip(steps["statement"], steps["value"], strict=True)
            if s.startswith("SELECT coalesce")]
    assert held == ["5/1, 5/2", "5/2", "5/2, 5/3", "5/2", "none"]
