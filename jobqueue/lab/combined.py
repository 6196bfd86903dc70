"""Lesson 06: the combined pattern. A batch processor that

1. takes an advisory lock with `pg_try_advisory_lock` on a connection of its
   own (a second processor started meanwhile gets false and skips the run),
2. opens ONE transaction on its work connection,
3. runs each item inside a savepoint of that transaction, so a bad item
   rolls back alone (`ROLLBACK TO SAVEPOINT`) and the others go on,
4. commits once, and releases the lock.

`process_batch_in_transaction` is the variant with the lock inside the
batch's own transaction (`pg_try_advisory_xact_lock`): lock and writes commit,
roll back or die together. `statement_trace` records every statement either
one sends, as the driver sent it.

Written with plain asyncpg and explicit SQL so that every statement is in
sight; jobqueue's lanes (`jobqueue/worker/lane.py`) do the same per batch, with the
handlers' statements coming through SQLAlchemy (`jobqueue/worker/handler.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import asyncpg

from jobqueue import db, lab
from jobqueue.errors import is_connection_error
from jobqueue.testing import wait_for

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
    #: The lock's connection ended while the batch ran (the lock went with it).
    lock_lost: bool = False

    @property
    def counts(self) -> dict[str, int]:
        counts = {"committed": 0, "rolled back": 0}
        for item in self.items:
            counts[item.outcome] += 1
        return counts


#: Where `statement_trace` writes, while one is open.
_trace: ContextVar[list[str] | None] = ContextVar("combined_trace", default=None)


@contextlib.contextmanager
def statement_trace() -> Iterator[list[str]]:
    """Every statement the processors send while the block runs, one line
    each: the connection's name, the SQL as sent, and its arguments. It is
    asyncpg's own query log (`add_query_logger`), so BEGIN, SAVEPOINT and
    COMMIT from `conn.transaction()` are in it too, in the order sent."""
    lines: list[str] = []
    token = _trace.set(lines)
    try:
        yield lines
    finally:
        _trace.reset(token)


async def _connect(url: str, name: str, label: str) -> asyncpg.Connection:
    """A processor's connection, named `name` in pg_stat_activity, and traced
    (its lines headed `label`) if a `statement_trace` is open."""
    conn = await db.connect(url, application_name=name)
    lines = _trace.get()
    if lines is not None:
        def log(record: Any) -> None:
            args = ", ".join(f"${n}={a}" for n, a in enumerate(record.args or (), 1))
            failed = type(record.exception).__name__ if record.exception else ""
            lines.append(f"{label:<7} {' '.join(record.query.split())}"
                         + (f"   -- {args}" if args else "")
                         + (f"   -> {failed}" if failed else ""))
        conn.add_query_logger(log)
    return conn


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


#: Awaited after each item with the item's number (the lesson uses it to
#: break a connection mid-batch, at a point of its choosing).
AfterItem = Callable[[int], Awaitable[None]]


async def process_batch(
    url: str,
    items: Sequence[Mapping[str, Any]],
    *,
    name: str,
    key: int = PROCESSOR_KEY,
    after_lock: Callable[[], Awaitable[None]] | None = None,
    after_item: AfterItem | None = None,
) -> BatchReport:
    """Run `items` (payments: payment_id, user_id, amount) as one batch, if
    this processor gets the lock; else skip and say who holds it.

    The lock lives on a connection of its own and the work on another: the
    lock says who may start, but nothing ties it to the work's COMMIT.

    after_lock: awaited once the lock is held, before the work starts (the
    lesson uses it to start a second processor at that moment).
    """
    lock_conn = await _connect(url, f"lab processor {name}", f"{name} lock")
    try:
        got = await lock_conn.fetchval("SELECT pg_try_advisory_lock($1, $2)", LESSON, key)
        if not got:
            holder = await _holder_of_lock(lock_conn, key)
            return BatchReport(name, ran=False, note=f"skipped: lock held by {holder!r}")
        report = BatchReport(name, ran=True, note="ran the batch")
        try:
            if after_lock is not None:
                await after_lock()
            work = await _connect(url, f"lab processor {name} work", f"{name} work")
            try:
                began = time.perf_counter()
                async with work.transaction():  # one transaction for the batch
                    await _run_items(work, items, report, began, after_item)
                report.committed_at = time.perf_counter() - began  # one commit, for all
            finally:
                await work.close()
        finally:
            report.lock_lost = not await _unlock(lock_conn, key)
        return report
    finally:
        await lock_conn.close()


async def _unlock(lock_conn: asyncpg.Connection, key: int) -> bool:
    """Release the lock; False if its connection is gone (and the lock with it)."""
    try:
        return bool(await lock_conn.fetchval("SELECT pg_advisory_unlock($1, $2)", LESSON, key))
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
        if lock_conn.is_closed() or is_connection_error(exc):
            return False
        raise


async def process_batch_in_transaction(
    url: str,
    items: Sequence[Mapping[str, Any]],
    *,
    name: str,
    key: int = PROCESSOR_KEY,
    after_lock: Callable[[], Awaitable[None]] | None = None,
    after_item: AfterItem | None = None,
) -> BatchReport:
    """The same batch with the lock inside its own transaction, on one
    connection: `pg_try_advisory_xact_lock` first, then the items, then the
    one COMMIT, which releases the lock (there is no unlock: COMMIT, ROLLBACK
    or the connection's end release it, together with the writes)."""
    conn = await _connect(url, f"lab processor {name}", name)
    try:
        began = time.perf_counter()
        async with conn.transaction():  # one transaction: the lock, every item, one COMMIT
            got = await conn.fetchval("SELECT pg_try_advisory_xact_lock($1, $2)", LESSON, key)
            if not got:
                holder = await _holder_of_lock(conn, key)
                return BatchReport(name, ran=False, note=f"skipped: lock held by {holder!r}")
            report = BatchReport(name, ran=True, note="ran the batch")
            if after_lock is not None:
                await after_lock()
            await _run_items(conn, items, report, began, after_item)
        report.committed_at = time.perf_counter() - began  # the lock ended with this COMMIT
        return report
    finally:
        await conn.close()


async def _run_items(work: asyncpg.Connection, items: Sequence[Mapping[str, Any]],
                     report: BatchReport, began: float, after_item: AfterItem | None) -> None:
    for number, item in enumerate(items, 1):
        started = time.perf_counter() - began
        error = await _process_item(work, item)
        report.items.append(ItemOutcome(
            number, str(item["payment_id"]), int(item["user_id"]),
            Decimal(str(item["amount"])), "rolled back" if error else "committed",
            error, started, time.perf_counter() - began))
        if after_item is not None:
            await after_item(number)


#: Either processor: process_batch or process_batch_in_transaction.
Processor = Callable[..., Coroutine[Any, Any, BatchReport]]


async def run_side_by_side(
    url: str, items: Sequence[Mapping[str, Any]], names: tuple[str, str] = ("A", "B"),
    *, process: Processor = process_batch,
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

    task = asyncio.create_task(process(url, items, name=first,
                                       after_lock=hold_until_second_tried))
    waiter = asyncio.create_task(first_has_lock.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if not first_has_lock.is_set():
        waiter.cancel()
        return [await task]  # the first one failed: its error surfaces here
    try:
        report_second = await process(url, items, name=second)
    finally:
        second_done.set()
    return [await task, report_second]


@dataclass
class Takeover:
    """A lock connection that died mid-batch: what each processor did, and
    the order things happened in (the order is forced, so it is the same
    every run)."""

    reports: list[BatchReport]
    events: list[str]


async def _activity(observer: asyncpg.Connection, name: str) -> asyncpg.Record | None:
    return await observer.fetchrow(
        "SELECT pid, wait_event_type, wait_event FROM pg_stat_activity "
        "WHERE application_name = $1 AND datname = current_database()", name)


async def lock_dies_mid_batch(url: str, items: Sequence[Mapping[str, Any]], *,
                              process: Processor = process_batch, after: int = 2) -> Takeover:
    """Processor A runs the batch; after item `after`, the connection that
    holds A's lock is terminated (`pg_terminate_backend`: a network cut, an
    idle timeout, a pooler), and processor B starts at once.

    With `process_batch` only the lock dies: A's work connection lives on,
    B gets the lock while A's transaction is still open, and A goes on
    writing and commits. With `process_batch_in_transaction` the lock's
    connection is the work's: A's writes die with its lock."""
    observer = await db.connect(url, application_name="lab observer")
    events: list[str] = []
    second: asyncio.Task[BatchReport] | None = None

    async def cut_the_lock(number: int) -> None:
        nonlocal second
        if number != after:
            return
        events.append(f"A wrote items 1-{after}, not committed")
        lock_holder = await _activity(observer, "lab processor A")
        assert lock_holder is not None, "A's lock connection is not there"
        await observer.fetchval("SELECT pg_terminate_backend($1)", lock_holder["pid"])
        await wait_for(lambda: _gone(observer, lock_holder["pid"]), message="A's lock gone")
        events.append("the connection holding A's lock was terminated; the lock went with it")
        second = asyncio.create_task(process(url, items, name="B"))
        started = await wait_for(lambda: _b_started(observer, second),
                                 message="B took the lock or finished")
        events.append(started)

    try:
        try:
            first = await process(url, items, name="A", after_item=cut_the_lock)
            events.append(f"A committed {first.counts['committed']} payments"
                          + (" after losing its lock" if first.lock_lost else ""))
        except Exception as exc:
            if not is_connection_error(exc):
                raise
            first = BatchReport("A", ran=True, note="its connection died: nothing committed",
                                lock_lost=True)
            events.append("A's next statement failed, its connection gone: its transaction "
                          "died with its lock, and its writes with it")
        if second is None:
            raise RuntimeError(f"the batch has fewer than {after} items: nothing was cut")
        reports = [first, await second]
    finally:
        if second is not None and not second.done():
            second.cancel()
        await observer.close()
    events.append(f"B committed {reports[1].counts['committed']} payments "
                  f"and rolled back {reports[1].counts['rolled back']}")
    return Takeover(reports, events)


async def _gone(observer: asyncpg.Connection, pid: int) -> bool:
    return not await observer.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid)


async def _b_started(observer: asyncpg.Connection, second: asyncio.Task[BatchReport]) -> str:
    """'' until B holds the lock and is either done or waiting for a row A
    holds; then what B is doing, in a sentence."""
    if second.done():
        return "B took the lock and ran its whole batch at once: nothing of A's was in its way"
    work = await _activity(observer, "lab processor B work")
    if work is not None and work["wait_event_type"] == "Lock":
        return (f"B took the lock while A's transaction was still open; B's first item now "
                f"waits for a row A wrote (wait_event {work['wait_event']})")
    return ""


def runs_table(reports: Sequence[BatchReport]) -> Any:
    """One row per processor: did it run, and how its items ended."""
    return lab.table({"processor": r.processor, "ran": r.ran, "note": r.note, **r.counts,
                      "lost its lock": r.lock_lost}
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
