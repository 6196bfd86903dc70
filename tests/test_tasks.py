"""Typed tasks: the call is checked before anything is written, the function
gets its arguments back as their types, `wait` gives the typed result back,
and a task is a job type like any other."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import pickle
import subprocess
import sys
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
import pydantic
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

import jobqueue
from jobqueue import HandlerRegistry, Task, TaskJob, enqueue, task
from jobqueue.testing import drain


class Tier(enum.Enum):
    GOLD = "gold"
    SILVER = "silver"


@dataclasses.dataclass(frozen=True)
class Line:
    sku: str
    price: Decimal


@dataclasses.dataclass(frozen=True)
class Receipt:
    order_id: int
    total: Decimal
    lines: list[Line]
    paid_at: dt.datetime


class Customer(pydantic.BaseModel):
    id: uuid.UUID
    since: dt.date


class Opaque:
    """Neither a dataclass nor a model: nothing could rebuild it from JSON."""


WHEN = dt.datetime(2026, 12, 5, 9, 30, tzinfo=dt.UTC)
CUSTOMER = Customer(id=uuid.UUID(int=7), since=dt.date(2020, 1, 2))


def make_charge(registry: HandlerRegistry, seen: list[dict[str, Any]]) -> Any:
    @task(queue="billing", priority=5, timeout=30, max_retries=5, registry=registry)
    async def charge(session: Any, order_id: int, amount: Decimal, lines: list[Line],
                     customer: Customer, tier: Tier = Tier.SILVER,
                     note: str | None = None) -> Receipt:
        seen.append({"order_id": order_id, "amount": amount, "lines": lines,
                     "customer": customer, "tier": tier, "note": note})
        await session.execute(text("INSERT INTO effects (job_id) VALUES (:id)"),
                              {"id": jobqueue.current_job().id})
        return Receipt(order_id, amount * 2, lines, WHEN)
    return charge


async def test_a_task_runs_with_its_arguments_typed_and_wait_gives_the_typed_result_back(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection
) -> None:
    registry, seen = HandlerRegistry(), []
    charge = make_charge(registry, seen)
    lines = [Line("A-1", Decimal("4.995"))]
    async with engine.begin() as s:
        job = await charge.enqueue(s, 42, Decimal("9.99"), lines=lines, customer=CUSTOMER,
                                   tier=Tier.GOLD)
    assert isinstance(job, TaskJob) and isinstance(job, uuid.UUID)
    row = await conn.fetchrow("SELECT job_type, queue, priority, max_retries, payload::text "
                              "FROM jobs WHERE id = $1", job)
    assert (row["job_type"], row["queue"], row["priority"], row["max_retries"]) == (
        "charge", "billing", 5, 5)
    assert json.loads(row["payload"]) == {  # only what was given: defaults apply at run time
        "order_id": 42, "amount": "9.99", "lines": [{"sku": "A-1", "price": "4.995"}],
        "customer": {"id": str(uuid.UUID(int=7)), "since": "2020-01-02"}, "tier": "gold"}
    assert registry.timeout("charge") == 30.0

    report = await drain(db_url, registry=registry, queues=["billing"])
    assert report["processed"] == 1 and report["failed"] == 0
    assert seen == [{"order_id": 42, "amount": Decimal("9.99"), "lines": lines,
                     "customer": CUSTOMER, "tier": Tier.GOLD, "note": None}]
    assert type(seen[0]["amount"]) is Decimal and type(seen[0]["lines"][0]) is Line
    assert await conn.fetchval("SELECT count(*) FROM effects WHERE job_id = $1", job) == 1

    finished = await jobqueue.wait(job, timeout=10, database=db_url)
    assert finished.result == Receipt(42, Decimal("19.98"), lines, WHEN)
    plain = await jobqueue.wait(uuid.UUID(str(job)), timeout=10, database=db_url)
    assert plain.result == {"order_id": 42, "total": "19.98", "paid_at": WHEN.isoformat(),
                            "lines": [{"sku": "A-1", "price": "4.995"}]}


CUST = CUSTOMER
WRONG_CALLS: list[tuple[tuple[Any, ...], dict[str, Any], str]] = [
    ((42, Decimal(1), [], CUST), {"wrong": 1},
     r"charge\(\): got an unexpected keyword argument 'wrong'"),
    ((), {"order_id": 42, "lines": [], "customer": CUST},
     r"charge\(\): missing a required argument: 'amount'"),
    (("42", Decimal(1), [], CUST), {}, r"charge\(\): order_id: expected an int, got str '42'"),
    ((True, Decimal(1), [], CUST), {}, r"order_id: expected an int, got bool True"),
    ((42, 9.99, [], CUST), {}, r"amount: expected a Decimal \(or an int\), got float 9.99"),
    ((42, Decimal("NaN"), [], CUST), {}, r"amount: expected a finite Decimal"),
    ((42, Decimal(1), [Line("A", Decimal(1)), ("B", 1)], CUST), {},
     r"lines\[1\]: expected a Line, got tuple"),
    ((42, Decimal(1), [Line("A", 1.5)], CUST), {},  # type: ignore[arg-type]
     r"lines\[0\]\['price'\]: expected a Decimal"),
    ((42, Decimal(1), [], {"id": 1}), {}, r"customer: expected a Customer, got dict"),
    ((42, Decimal(1), [], CUST), {"tier": "gold"}, r"tier: expected a Tier, got str 'gold'"),
    ((42, Decimal(1), [], CUST), {"note": 3}, r"note: expected str \| None, got int 3"),
]


@pytest.mark.parametrize(("args", "kwargs", "message"), WRONG_CALLS)
async def test_a_wrong_call_is_a_type_error_at_the_call_and_nothing_is_written(
    engine: AsyncEngine, conn: asyncpg.Connection, args: tuple[Any, ...], kwargs: dict[str, Any],
    message: str
) -> None:
    charge = make_charge(HandlerRegistry(), [])
    with pytest.raises(TypeError, match=message):
        charge.arguments(*args, **kwargs)
    async with engine.begin() as s:
        with pytest.raises(TypeError, match=message):
            await charge.enqueue(s, *args, **kwargs)
        await enqueue(s, "marker")  # the transaction goes on: nothing was sent
    assert await conn.fetchval("SELECT array_agg(job_type) FROM jobs") == ["marker"]


async def test_a_task_is_a_job_type_like_any_other_and_a_bad_payload_by_name_fails_saying_why(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection
) -> None:
    registry, seen = HandlerRegistry(), []
    make_charge(registry, seen)
    customer = {"id": str(uuid.UUID(int=7)), "since": "2020-01-02"}
    async with engine.begin() as s:  # the string form runs the same typed function
        by_name = await enqueue(s, "charge", {"order_id": 7, "amount": "1.50", "lines": [],
                                              "customer": customer}, queue="billing")
        bad = await enqueue(s, "charge", {"order_id": "7", "amount": "1.50", "lines": [],
                                          "customer": customer}, queue="billing", max_retries=0)
        unknown = await enqueue(s, "charge", {"order_id": 7, "amount": "1", "lines": [],
                                              "customer": customer, "coupon": "X"},
                                queue="billing", max_retries=0)
        missing = await enqueue(s, "charge", {"order_id": 7}, queue="billing", max_retries=0)
    report = await drain(db_url, registry=registry, queues=["billing"])
    assert report["processed"] == 1 and report["failed"] == 3
    assert seen[0]["amount"] == Decimal("1.50") and seen[0]["customer"] == CUSTOMER
    errors = dict(await conn.fetch("SELECT id, error_message FROM jobs WHERE status = 'failed'"))
    assert "charge(): order_id: expected a whole number, got str '7'" in errors[bad]
    assert "charge() has no parameter 'coupon'" in errors[unknown]
    assert "charge(): missing a required argument: 'amount'" in errors[missing]
    assert by_name not in errors


async def test_numbers_a_handler_cannot_mean_fail_the_job_naming_the_parameter(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection
) -> None:
    """Non-finite, signalling or huge Decimals, Decimal strings with spaces or
    underscores, `1e300` for an int (jsonb gives back a 301-digit int), an int
    no float can hold: each job fails before its function runs, saying which
    parameter (issue 49)."""
    registry, ran = HandlerRegistry(), []

    @task(max_retries=0, registry=registry)
    async def pay(session: Any, amount: Decimal = Decimal(1), n: int = 1,
                  ratio: float | str = 1.0) -> None:
        ran.append((amount, n, ratio))

    bad = [{"amount": text} for text in ("Infinity", "NaN", "sNaN", "1e999999999", " 12 ",
                                         "1_000")]
    bad += [{"n": 1e300}, {"ratio": 10**399}]
    async with engine.begin() as s:
        ids = [await enqueue(s, "pay", payload, max_retries=0) for payload in bad]
        good = await enqueue(s, "pay", {"amount": "9.99", "n": 2**63 - 1, "ratio": 10**300})
    report = await drain(db_url, registry=registry)
    assert report["failed"] == len(bad) and report["processed"] == 1
    assert ran == [(Decimal("9.99"), 2**63 - 1, 1e300)]  # only the good job ran
    errors = dict(await conn.fetch("SELECT id, error_message FROM jobs WHERE id = ANY($1)", ids))
    for job_id, payload in zip(ids, bad, strict=True):
        [name] = payload
        assert errors[job_id].startswith(f"TypeError: pay(): {name}: expected "), errors[job_id]
    assert "got int of about 301 digits" in errors[ids[-2]]  # 1e300, as jsonb gives it back
    assert await conn.fetchval("SELECT status FROM jobs WHERE id = $1", good) == "completed"


async def test_per_call_options_and_enqueue_many(
    engine: AsyncEngine, conn: asyncpg.Connection
) -> None:
    charge = make_charge(HandlerRegistry(), [])
    later = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    urgent = charge.with_options(priority=100, run_at=later, unique_key="order-42")
    assert urgent.options.queue == "billing" and charge.options.priority == 5  # a copy
    async with engine.begin() as s:
        first = await urgent.enqueue(s, 42, Decimal(1), [], CUSTOMER)
        again = await urgent.enqueue(s, 42, Decimal(1), [], CUSTOMER)
        many = await charge.with_options(queue="bulk").enqueue_many(
            s, [charge.arguments(n, Decimal(n), [], CUSTOMER) for n in range(3)])
    assert again == first  # the key's holder
    row = await conn.fetchrow("SELECT priority, run_at, unique_key FROM jobs WHERE id = $1", first)
    assert (row["priority"], row["run_at"], row["unique_key"]) == (100, later, "order-42")
    rows = await conn.fetch("SELECT queue, payload->'order_id' AS n FROM jobs WHERE id = ANY($1) "
                            "ORDER BY n", list(many))
    assert [(r["queue"], json.loads(r["n"])) for r in rows] == [("bulk", 0), ("bulk", 1),
                                                                 ("bulk", 2)]
    assert all(isinstance(job, TaskJob) for job in many)

    other = make_charge(HandlerRegistry(), [])
    refund = task(name="refund", registry=HandlerRegistry())(other.func)
    async with engine.begin() as s:
        with pytest.raises(TypeError, match=r"call #0 is not charge.arguments"):
            await charge.enqueue_many(s, [refund.arguments(1, Decimal(1), [], CUSTOMER)])
        with pytest.raises(ValueError, match="enqueue_many takes no unique key"):
            await urgent.enqueue_many(s, [])
    with pytest.raises(ValueError, match="priority must be between"):
        charge.with_options(priority=5000)
    assert await conn.fetchval("SELECT count(*) FROM jobs") == 4


async def test_a_sync_task_runs_in_a_thread_with_its_arguments_typed(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection
) -> None:
    registry = HandlerRegistry()

    @task(registry=registry)
    def stamp(session: Any, when: dt.datetime, ids: tuple[uuid.UUID, ...]) -> list[uuid.UUID]:
        for job_id in ids:
            session.execute(text("INSERT INTO effects (job_id, at) VALUES (:id, :at)"),
                            {"id": job_id, "at": when})
        return list(reversed(ids))

    assert registry.is_sync("stamp")
    ids = (uuid.UUID(int=1), uuid.UUID(int=2))
    async with engine.begin() as s:
        job = await stamp.enqueue(s, WHEN, ids)
    report = await drain(db_url, registry=registry)
    assert report["processed"] == 1 and report["failed"] == 0
    stored = await conn.fetch("SELECT job_id, at FROM effects ORDER BY job_id")
    assert [(r["job_id"], r["at"]) for r in stored] == [(ids[0], WHEN), (ids[1], WHEN)]
    assert (await jobqueue.wait(job, timeout=10, database=db_url)).result == [ids[1], ids[0]]


async def test_a_result_that_does_not_match_the_annotation_fails_the_job_and_rolls_back(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection
) -> None:
    registry = HandlerRegistry()

    @task(max_retries=0, registry=registry)
    async def total(session: Any, n: int) -> Decimal:
        await session.execute(text("INSERT INTO effects (job_id) VALUES (:id)"),
                              {"id": jobqueue.current_job().id})
        return n * 1.5  # type: ignore[return-value]

    async with engine.begin() as s:
        job = await total.enqueue(s, 3)
    await drain(db_url, registry=registry)
    finished = await jobqueue.wait(job, timeout=10, database=db_url)
    assert finished.status == "failed" and finished.result is None
    assert "total() returned: expected a Decimal (or an int), got float 4.5" in str(
        finished.error_message)
    assert await conn.fetchval("SELECT count(*) FROM effects") == 0


def test_what_a_task_cannot_be_is_refused_at_the_decorator_and_nothing_is_registered() -> None:
    registry = HandlerRegistry()

    async def opaque(session: Any, thing: Opaque) -> None: ...
    async def returns_opaque(session: Any) -> Opaque: ...
    async def star(session: Any, *ids: int) -> None: ...
    async def positional(session: Any, n: int, /) -> None: ...
    async def nothing() -> None: ...
    async def keys(session: Any, by_id: dict[int, str]) -> None: ...
    async def needs(session: Any, n: int) -> None: ...

    cases = [
        (task(registry=registry), opaque, r"task 'opaque', parameter 'thing': Opaque cannot "
                                          r"be read back from JSON; use a dataclass"),
        (task(registry=registry), returns_opaque, r"its return annotation: Opaque cannot"),
        (task(registry=registry), star, r"parameter 'ids' is variadic positional"),
        (task(registry=registry), positional, r"parameter 'n' is positional-only"),
        (task(registry=registry), nothing, r"first parameter is the session; it has none"),
        (task(registry=registry), keys, r"JSON object keys are strings"),
        (task(every=60, registry=registry), needs, r"give 'n' a default"),
    ]
    for decorator, func, message in cases:
        with pytest.raises(TypeError, match=message):
            decorator(func)
    with pytest.raises(ValueError, match="queue .* is not a valid name"):
        task(queue="no spaces", registry=registry)
    with pytest.raises(ValueError, match="job type must not be empty"):
        task(name=" ", registry=registry)(needs)
    assert len(registry) == 0


def test_a_task_job_is_a_uuid_and_calling_a_task_calls_its_function() -> None:
    registry = HandlerRegistry()

    @task(registry=registry)
    def double(session: Any, n: int) -> int:
        return n * 2

    assert isinstance(double, Task) and double(None, 4) == 8 and double.__name__ == "double"
    job = TaskJob(uuid.UUID(int=5), double)
    assert job == uuid.UUID(int=5) and hash(job) == hash(uuid.UUID(int=5))
    assert type(pickle.loads(pickle.dumps(job))) is uuid.UUID
    assert str(job) == str(uuid.UUID(int=5))


MYPY_CHECKED = """
from decimal import Decimal
from typing import Any
from sqlalchemy.ext.asyncio import AsyncSession
from jobqueue import task, wait

@task(queue="billing")
async def charge(session, order_id: int, amount: Decimal) -> str:
    return "ok"

@task
def resize(session: Any, image_id: int) -> int:
    return image_id

async def main(session: AsyncSession) -> None:
    job = await charge.enqueue(session, order_id=42, amount=Decimal("9.99"))
    receipt: str = (await wait(job)).result
    size: int = (await wait(await resize.enqueue(session, 3))).result
    await charge.enqueue(session, order_id="42", amount=Decimal("9.99"))  # line 19
    await charge.enqueue(session, order=42, amount=Decimal("9.99"))  # line 20
    await resize.with_options(priority=3).enqueue(session, image_id="x")  # line 21
    wrong: int = (await wait(job)).result  # line 22
    charge.arguments(42)  # line 23
"""


def test_mypy_checks_a_task_call_against_the_function(tmp_path: Path) -> None:
    """The package ships py.typed, and a task carries its parameters as a
    ParamSpec: mypy finds in the caller's code what the call would raise."""
    source = tmp_path / "calls.py"
    source.write_text(MYPY_CHECKED)
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--cache-dir",
         str(tmp_path / "cache"), "--hide-error-context", str(source)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300)
    errors = {int(line.split(":")[1]): line for line in checked.stdout.splitlines()
              if ": error:" in line}
    assert sorted(errors) == [19, 20, 21, 22, 23], checked.stdout + checked.stderr
    assert 'Argument "order_id" to "enqueue" of "Task" has incompatible type "str"' in errors[19]
    assert 'Unexpected keyword argument "order"' in errors[20]
    assert 'expression has type "str", variable has type "int"' in errors[22]
    assert 'Missing positional argument "amount"' in errors[23]
