"""Lesson 06: the combined pattern. A batch processor that

1. takes an advisory lock with `pg_try_advisory_lock` on a connection of its
   own (a second processor started meanwhile gets false and skips the run),
2. opens ONE transaction on its work connection,
3. runs each item inside a savepoint of that transaction, so a bad item
   rolls back alone (`ROLLBACK TO SAVEPOINT`) and the others go on,
4. commits once, and releases the lock.

Written with plain asyncpg and explicit SQL so that every statement is in
sight; jobqueue's lanes (`jobqueue/worker/lane.py`) do the same per batch, with the
handlers' statements coming through SQLAlchemy (`jobqueue/worker/handler.py`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import asyncpg

from jobqueue import db, lab

#: The advisory lock class of lesson 06 (jobqueue owns 74171 and 74172).
LESSON = 6
#: The key of the batch processor's lock.
PROCESSOR_KEY = 1


@dataclass
class ItemOutcome:
    """What became of one item: committed with the batch, or rolled back to
    its savepoint (and why). Times are seconds since the batch began."""

    number: int
    payment_id: str
    user_id: int
    amount: Decimal
    outcome: str
    error: str
    started: float
    ended: float


@dataclass
class BatchReport:
    processor: str
    ran: bool
    note: str = ""
    items: list[ItemOutcome] = field(default_factory=list)
    committed_at: float | None = None

    @property
    def counts(self) -> dict[str, int]:
        counts = {"committed": 0, "rolled back": 0}
        for item in self.items:
            counts[item.outcome] += 1
        return counts


async def _holder_of_lock(conn: asyncpg.Connection, key: int) -> str:
    """Who holds (LESSON, key), by application_name: what a skipped processor
    can tell its operator."""
    name = await conn.fetchval(
        """SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a USING (pid)
           WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1 AND l.objid = $2
             AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())""",
        LESSON, key)
    return str(name) if name else "nobody (released meanwhile)"


async def _process_item(work: asyncpg.Connection, item: Mapping[str, Any]) -> str:
    """One payment inside a savepoint; '' on success, else the error's class.
    The savepoint is released on success and rolled back to on failure: in
    both cases the transaction can go on."""
    await work.execute("SAVEPOINT item")
    try:
        await work.execute(
            "UPDATE demo_users SET balance = balance + $1 WHERE id = $2",
            Decimal(str(item["amount"])), int(item["user_id"]))
        await work.execute(
            "INSERT INTO demo_payments (payment_id, user_id, amount) VALUES ($1, $2, $3)",
            str(item["payment_id"]), int(item["user_id"]), Decimal(str(item["amount"])))
    except asyncpg.PostgresError as exc:
        await work.execute("ROLLBACK TO SAVEPOINT item")
        await work.execute("RELEASE SAVEPOINT item")
        return type(exc).__name__
    await work.execute("RELEASE SAVEPOINT item")
    return ""


async def process_batch(
    url: str,
    items: Sequence[Mapping[str, Any]],
    *,
    name: str,
    key: int = PROCESSOR_KEY,
    after_lock: Callable[[], Awaitable[None]] | None = None,
) -> BatchReport:
    """Run `items` (payments: payment_id, user_id, amount) as one batch, if
    this processor gets the lock; else skip and say who holds it.

    after_lock: awaited once the lock is held, before the work starts (the
    lesson uses it to start a second processor at that moment).
    """
    lock_conn = await db.connect(url, application_name=f"lab processor {name}")
    try:
        got = await lock_conn.fetchval("SELECT pg_try_advisory_lock($1, $2)", LESSON, key)
        if not got:
            holder = await _holder_of_lock(lock_conn, key)
            return BatchReport(name, ran=False, note=f"skipped: lock held by {holder!r}")
        try:
            if after_lock is not None:
                await after_lock()
            return await _run_items(url, items, name)
        finally:
            await lock_conn.fetchval("SELECT pg_advisory_unlock($1, $2)", LESSON, key)
    finally:
        await lock_conn.close()


async def _run_items(url: str, items: Sequence[Mapping[str, Any]], name: str) -> BatchReport:
    report = BatchReport(name, ran=True, note="ran the batch")
    work = await db.connect(url, application_name=f"lab processor {name} work")
    try:
        began = time.perf_counter()
        async with work.transaction():  # one transaction for the batch
            for number, item in enumerate(items, 1):
                started = time.perf_counter() - began
                error = await _process_item(work, item)
                report.items.append(ItemOutcome(
                    number, str(item["payment_id"]), int(item["user_id"]),
                    Decimal(str(item["amount"])), "rolled back" if error else "committed",
                    error, started, time.perf_counter() - began))
        report.committed_at = time.perf_counter() - began  # one commit, for all
    finally:
        await work.close()
    return report


async def run_side_by_side(
    url: str, items: Sequence[Mapping[str, Any]], names: tuple[str, str] = ("A", "B")
) -> list[BatchReport]:
    """Two processors on the same items: the first takes the lock, and the
    second starts while the first holds it (not before: the order is fixed so
    that the lesson's output is the same every run). Both reports, first
    processor first."""
    first, second = names
    first_has_lock = asyncio.Event()
    second_done = asyncio.Event()

    async def hold_until_second_tried() -> None:
        first_has_lock.set()
        await asyncio.wait_for(second_done.wait(), timeout=10)

    task = asyncio.create_task(process_batch(url, items, name=first,
                                             after_lock=hold_until_second_tried))
    waiter = asyncio.create_task(first_has_lock.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if not first_has_lock.is_set():
        waiter.cancel()
        return [await task]  # the first one failed: its error surfaces here
    try:
        report_second = await process_batch(url, items, name=second)
    finally:
        second_done.set()
    return [await task, report_second]


def runs_table(reports: Sequence[BatchReport]) -> Any:
    """One row per processor: did it run, and how its items ended."""
    return lab.table({"processor": r.processor, "ran": r.ran, "note": r.note, **r.counts}
                     for r in reports).set_index("processor")


def outcome_table(report: BatchReport) -> Any:
    """One row per item of a batch: what it was and how it ended."""
    return lab.table({"item": i.number, "payment_id": i.payment_id, "user_id": i.user_id,
                      "amount": str(i.amount), "outcome": i.outcome, "error": i.error}
                     for i in report.items).set_index("item")


def plot_batch(report: BatchReport) -> Any:
    """The batch on a timeline: a bar per item while it ran, green if it
    committed, red if it was rolled back to its savepoint, and the one
    COMMIT at the end. Each item's fate is written to the right."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    colors = {"committed": "#2e7d32", "rolled back": "#c62828"}
    fig, ax = plt.subplots(figsize=(8, 0.8 + 0.45 * len(report.items)))
    end = (report.committed_at or max(i.ended for i in report.items)) * 1e3
    for i in report.items:
        span = (i.started * 1e3, max((i.ended - i.started) * 1e3, end / 200))
        ax.broken_barh([span], (i.number - 0.35, 0.7), color=colors[i.outcome])
        label = f"{i.payment_id}: {i.outcome}" + (f" ({i.error})" if i.error else "")
        ax.text(end * 1.04, i.number, label, va="center", fontsize=8)
    handles: list[Any] = [Patch(color=c, label=k) for k, c in colors.items()]
    if report.committed_at is not None:
        ax.axvline(end, color="black", linestyle="--")
        handles.append(Line2D([], [], color="black", linestyle="--", label="COMMIT (once)"))
    ax.set_yticks([i.number for i in report.items],
                  [f"item {i.number}" for i in report.items])
    ax.invert_yaxis()
    ax.set_xlabel("ms since the batch's transaction began")
    ax.set_xlim(0, end * 1.75)
    ax.legend(handles=handles, loc="lower left", fontsize=8)
    ax.set_title(f"Processor {report.processor}: one transaction, a savepoint per item")
    fig.tight_layout()
    plt.close(fig)
    return fig


async def enqueue_payments(engine: Any, items: Sequence[Mapping[str, Any]]) -> int:
    """The lesson's items as `process_payment` jobs, each enqueued in its own
    transaction (so their due times differ and a worker takes them in this
    order), none retried. Returns how many are pending."""
    from jobqueue import enqueue

    for item in items:
        async with engine.begin() as conn:
            await enqueue(conn, "process_payment", dict(item), max_retries=0)
    async with engine.connect() as conn:
        return int((await conn.exec_driver_sql(
            "SELECT count(*) FROM jobs WHERE status = 'pending'")).scalar_one())
