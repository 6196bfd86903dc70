"""Payloads and results holding what business code holds (Decimal, dates,
UUIDs, dataclasses, models) are stored as their JSON form; a type of one's own
takes one registration; what still cannot be stored writes nothing."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import uuid
from decimal import Decimal
from typing import Any

import asyncpg
import pydantic
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

import jobqueue
from jobqueue import HandlerRegistry, enqueue, enqueue_many
from jobqueue.codec import dumps
from jobqueue.testing import drain


class Colour(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Line:
    sku: str
    price: Decimal


class Customer(pydantic.BaseModel):
    id: uuid.UUID
    since: dt.date


ORDER_ID = uuid.UUID("0192f0c4-0000-7000-8000-000000000001")
WHEN = dt.datetime(2026, 12, 4, 9, 30, tzinfo=dt.UTC)

#: Each value, and the JSON a handler finds in its place.
CASES: list[tuple[object, object]] = [
    (Decimal("9.99"), "9.99"),
    (Decimal("1E+3"), "1E+3"),  # every digit and the exponent as written: Decimal(text) restores it
    (WHEN, "2026-12-04T09:30:00+00:00"),
    (dt.date(2026, 12, 4), "2026-12-04"),
    (dt.time(9, 30), "09:30:00"),
    (ORDER_ID, str(ORDER_ID)),
    (Colour.RED, "red"),
    (Line("A-1", Decimal("2.50")), {"sku": "A-1", "price": "2.50"}),
    (Customer(id=ORDER_ID, since=dt.date(2020, 1, 2)),
     {"id": str(ORDER_ID), "since": "2020-01-02"}),
]


@pytest.mark.parametrize(("value", "expected"), CASES, ids=[type(v).__name__ for v, _ in CASES])
def test_each_type_has_its_usual_json_form(value: object, expected: object) -> None:
    assert json.loads(dumps({"v": value})) == {"v": expected}


def test_what_json_cannot_hold_is_refused_saying_how_to_fix_it() -> None:
    class Opaque:
        pass

    for value in (Opaque(), {"a", "b"}):  # a set's order changes between processes
        with pytest.raises(TypeError, match="jobqueue.to_json.register"):
            dumps({"v": value})
    with pytest.raises(ValueError, match="not a finite number"):
        dumps({"v": Decimal("NaN")})


async def test_a_payload_of_business_types_reaches_the_handler_and_the_result_is_stored(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection
) -> None:
    registry = HandlerRegistry()
    seen: list[dict[str, Any]] = []

    @registry.register("invoice")
    async def invoice(session: Any, payload: dict[str, Any]) -> Line:
        seen.append(payload)
        return Line(sku=payload["lines"][0]["sku"], price=Decimal(payload["total"]) * 2)

    payload = {"order": ORDER_ID, "total": Decimal("9.99"), "at": WHEN,
               "lines": [Line("A-1", Decimal("9.99"))]}
    async with engine.begin() as s:
        job_id = await enqueue(s, "invoice", payload)
        await enqueue_many(s, "invoice", [payload])
    report = await drain(db_url, registry=registry)

    assert report["processed"] == 2 and report["failed"] == 0
    assert seen[0] == {"order": str(ORDER_ID), "total": "9.99", "at": "2026-12-04T09:30:00+00:00",
                       "lines": [{"sku": "A-1", "price": "9.99"}]}
    assert seen[0] == seen[1]  # enqueue_many encodes the same way
    stored = await conn.fetchval("SELECT result::text FROM jobs WHERE id = $1", job_id)
    assert json.loads(stored) == {"sku": "A-1", "price": "19.98"}


async def test_a_type_of_ones_own_takes_one_registration(
    engine: AsyncEngine, conn: asyncpg.Connection
) -> None:
    @dataclasses.dataclass(frozen=True)
    class Money:
        cents: int
        currency: str

    class Plain:  # not a dataclass: json would refuse it, and so does enqueue before this
        def __init__(self, money: Money) -> None:
            self.money = money

    async with engine.begin() as s:
        with pytest.raises(ValueError, match="not valid JSON.*Plain"):
            await enqueue(s, "pay", {"amount": Plain(Money(999, "EUR"))})

    @jobqueue.to_json.register(Plain)  # the class named: its annotation is not a global here
    def _(value: Plain) -> Money:  # returns another type: encoded in turn
        return value.money

    async with engine.begin() as s:
        job_id = await enqueue(s, "pay", {"amount": Plain(Money(999, "EUR"))})
    stored = await conn.fetchval("SELECT payload::text FROM jobs WHERE id = $1", job_id)
    assert json.loads(stored) == {"amount": {"cents": 999, "currency": "EUR"}}


async def test_a_nul_made_by_a_conversion_is_found_before_postgresql_and_nothing_is_written(
    engine: AsyncEngine, conn: asyncpg.Connection
) -> None:
    class Tag:
        pass

    jobqueue.to_json.register(Tag, lambda value: "a\x00b")
    async with engine.begin() as s:
        await enqueue(s, "ok", {"text": "a\\u0000b"})  # the six characters, not a NUL: stored
        with pytest.raises(ValueError, match=r"payload\['tags'\]\[1\] contains a NUL"):
            await enqueue(s, "tagged", {"tags": ["fine", Tag()]})
    assert await conn.fetchval("SELECT array_agg(job_type) FROM jobs") == ["ok"]
