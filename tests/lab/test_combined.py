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
