"""jobqueue.lab.combined: the lock-plus-savepoints batch processor of lesson 06."""

from __future__ import annotations

import asyncpg

from jobqueue.lab import combined, savepoints

ITEMS = [
    {"payment_id": "pay-1", "user_id": 1, "amount": -40},
    {"payment_id": "pay-2", "user_id": 2, "amount": -70},  # overdraft
    {"payment_id": "pay-1", "user_id": 1, "amount": -40},  # duplicate
    {"payment_id": "pay-3", "user_id": 2, "amount": 10},
]


async def test_one_processor_runs_and_bad_items_roll_back_alone(
    db_url: str, conn: asyncpg.Connection
) -> None:
    await savepoints.reset_accounts(conn, {1: 100, 2: 50})
    first, second = await combined.run_side_by_side(db_url, ITEMS)
    assert (first.ran, second.ran) == (True, False)
    assert second.note == "skipped: lock held by 'lab processor A'"
    assert [(i.outcome, i.error) for i in first.items] == [
        ("committed", ""), ("rolled back", "CheckViolationError"),
        ("rolled back", "UniqueViolationError"), ("committed", "")]
    assert first.counts == {"committed": 2, "rolled back": 2}
    assert await savepoints.balances(conn) == {1: "60.00", 2: "60.00"}
    assert list(combined.runs_table([first, second])["ran"]) == [True, False]
    assert len(combined.outcome_table(first)) == 4
    assert combined.plot_batch(first) is not None

    again = await combined.process_batch(db_url, ITEMS, name="B")
    assert again.ran and again.counts["committed"] == 0
    assert await savepoints.balances(conn) == {1: "60.00", 2: "60.00"}
    assert await conn.fetchval(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
        "(SELECT oid FROM pg_database WHERE datname = current_database())") == 0


async def advisory_locks(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
        "(SELECT oid FROM pg_database WHERE datname = current_database())"))


async def test_the_trace_holds_every_statement_in_order(
    db_url: str, conn: asyncpg.Connection
) -> None:
    await savepoints.reset_accounts(conn, {1: 100, 2: 50})
    with combined.statement_trace() as trace:
        await combined.run_side_by_side(db_url, ITEMS)
    statements = [line.split("   --")[0] for line in trace]
    assert statements[:2] == ["A lock  SELECT pg_try_advisory_lock($1, $2)",
                              "B lock  SELECT pg_try_advisory_lock($1, $2)"]
    assert statements[3] == "A work  BEGIN;" and statements[-2] == "A work  COMMIT;"
    assert statements[-1] == "A lock  SELECT pg_advisory_unlock($1, $2)"
    assert sum("ROLLBACK TO SAVEPOINT item" in s for s in statements) == 2
    assert any(line.endswith("-> CheckViolationError") for line in trace)
    assert any(line.endswith("-> UniqueViolationError") for line in trace)


async def test_a_lock_on_its_own_connection_does_not_fence_the_work(
    db_url: str, conn: asyncpg.Connection
) -> None:
    await savepoints.reset_accounts(conn, {1: 100, 2: 50})
    cut = await combined.lock_dies_mid_batch(db_url, ITEMS, after=2)
    first, second = cut.reports
    assert (first.ran, second.ran) == (True, True)  # both ran the batch
    assert first.lock_lost and first.committed_at is not None  # A committed after losing it
    assert first.counts == {"committed": 2, "rolled back": 2}
    assert second.counts == {"committed": 0, "rolled back": 4}  # only the keys saved the money
    assert "wait_event transactionid" in cut.events[2]
    assert await savepoints.balances(conn) == {1: "60.00", 2: "60.00"}
    assert await advisory_locks(conn) == 0


async def test_a_transaction_lock_dies_with_the_writes(
    db_url: str, conn: asyncpg.Connection
) -> None:
    await savepoints.reset_accounts(conn, {1: 100, 2: 50})
    cut = await combined.lock_dies_mid_batch(
        db_url, ITEMS, process=combined.process_batch_in_transaction, after=2)
    first, second = cut.reports
    assert first.lock_lost and first.counts == {"committed": 0, "rolled back": 0}
    assert second.counts == {"committed": 2, "rolled back": 2}  # B ran as if alone
    assert "nothing of A's was in its way" in cut.events[2]
    assert await savepoints.balances(conn) == {1: "60.00", 2: "60.00"}
    assert await savepoints.payments(conn) == ["pay-1", "pay-3"]


async def test_a_transaction_lock_keeps_a_second_processor_out_until_commit(
    db_url: str, conn: asyncpg.Connection
) -> None:
    await savepoints.reset_accounts(conn, {1: 100, 2: 50})
    with combined.statement_trace() as trace:
        first, second = await combined.run_side_by_side(
            db_url, ITEMS, process=combined.process_batch_in_transaction)
    assert (first.ran, second.ran) == (True, False)
    assert second.note == "skipped: lock held by 'lab processor A'"
    assert first.counts == {"committed": 2, "rolled back": 2}
    assert not any("unlock" in line for line in trace)  # COMMIT released it
    assert await advisory_locks(conn) == 0
    assert await savepoints.balances(conn) == {1: "60.00", 2: "60.00"}
