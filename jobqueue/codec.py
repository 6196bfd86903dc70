"""How payloads and results become JSON: the types a business app holds, and
a hook for the ones it defines.

A job's payload and a handler's result are stored as jsonb, so whatever is
put in must become JSON on the way. `json` alone refuses `Decimal("9.99")`,
a `datetime` or a `UUID`, which are exactly what an order or an invoice holds;
`to_json` turns them into their usual JSON form before anything is written:

====================================  =================================
value                                 stored as
====================================  =================================
`Decimal`                             string, every digit kept ("9.99")
`datetime`, `date`, `time`            ISO 8601 string
`UUID`                                string
`Enum`                                its value
dataclass instance                    object of its fields
pydantic model (anything with         `model_dump(mode="json")`
``model_dump``)
====================================  =================================

The handler receives the JSON form (a string for a Decimal): JSON has no
Decimal type, and reading "9.99" back as `Decimal(payload["amount"])` is
exact, where a float would not be. A type of your own takes one function::

    @jobqueue.to_json.register
    def _(money: Money) -> dict:
        return {"amount": str(money.amount), "currency": money.currency}

Registrations are process-wide (`functools.singledispatch`), made at import
time like handlers; what a function returns is encoded in turn, so it may
hold other registered types. Sets are left out on purpose: their order
changes from one process to the next, and a payload should not.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import functools
import json
import uuid
from decimal import Decimal
from typing import Any

__all__ = ["dumps", "to_json"]


@functools.singledispatch
def to_json(value: Any) -> Any:
    """A value JSON can hold in place of `value`, for a type `json` refuses;
    register your own types on it. TypeError when none applies."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
    model_dump = getattr(value, "model_dump", None)  # pydantic v2, without importing it
    if callable(model_dump) and not isinstance(value, type):
        return model_dump(mode="json")
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable "
                    "(register a conversion with jobqueue.to_json.register)")


@to_json.register
def _decimal(value: Decimal) -> str:
    if not value.is_finite():  # JSON has no NaN or Infinity; jsonb would refuse them too
        raise ValueError(f"Decimal {value} is not a finite number")
    return str(value)


@to_json.register(dt.date)  # datetime is a date
@to_json.register(dt.time)
def _iso(value: dt.date | dt.time) -> str:
    return value.isoformat()


@to_json.register
def _uuid(value: uuid.UUID) -> str:
    return str(value)


@to_json.register
def _enum(value: enum.Enum) -> Any:
    return value.value


def dumps(value: Any) -> str:
    """Compact JSON text for a jsonb column: no NaN (jsonb refuses it), non-ASCII
    kept as is, and `to_json` for what `json` cannot encode by itself."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"),
                      default=to_json)
