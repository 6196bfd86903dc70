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
    assert "complete  (jobqueue/schema/queries.sql)" in trace
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
