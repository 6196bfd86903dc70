"""Converters by annotation (no database): every supported shape goes to JSON
and comes back equal and of its type; what does not fit says where."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import uuid
from decimal import Decimal
from typing import Annotated, Any, Literal, NewType, Optional

import pydantic
import pytest

from jobqueue.typed import converter

OrderId = NewType("OrderId", int)


class Size(enum.IntEnum):
    S = 1
    M = 2


@dataclasses.dataclass
class Node:
    """Holds itself: the converter refers to its own converter lazily."""

    name: str
    children: list[Node] = dataclasses.field(default_factory=list)
    seen: int = dataclasses.field(default=0, init=False)


class Point(pydantic.BaseModel):
    x: Decimal
    at: dt.datetime


AT = dt.datetime(2026, 12, 5, 10, 0, tzinfo=dt.timezone(dt.timedelta(hours=1)))

ROUND_TRIPS: list[tuple[Any, Any]] = [
    (int, 7), (float, 2.5), (str, "é\n"), (bool, False), (type(None), None), (Any, {"a": [1]}),
    (Decimal, Decimal("0.10")), (Decimal, Decimal("-1E+3")), (dt.datetime, AT),
    (dt.date, dt.date(2026, 2, 28)), (dt.time, dt.time(23, 59, 1, 5)),
    (uuid.UUID, uuid.UUID(int=99)), (Size, Size.M), (OrderId, OrderId(5)),
    (Annotated[int, "meta"], 3), (Literal["a", 1], 1), (Optional[Decimal], None),  # noqa: UP045 - the old spelling too
    (Decimal | None, Decimal("1.5")), (int | str, "5"), (list[Decimal], [Decimal(1)]),
    (tuple[int, ...], (1, 2)), (tuple[int, str], (1, "a")), (dict[str, dt.date],
                                                             {"k": dt.date(2020, 1, 1)}),
    (Node, Node("root", [Node("leaf")])), (Point, Point(x=Decimal("1.10"), at=AT)),
]


@pytest.mark.parametrize(("annotation", "value"), ROUND_TRIPS,
                         ids=[str(i) for i in range(len(ROUND_TRIPS))])
def test_each_shape_goes_to_json_and_comes_back_equal_and_of_its_type(
    annotation: Any, value: Any
) -> None:
    made = converter(annotation)
    stored = json.loads(json.dumps(made.encode(value)))  # what jsonb would give back
    back = made.decode(stored)
    assert back == value and type(back) is type(value)


def test_what_does_not_fit_says_where() -> None:
    cases: list[tuple[Any, Any, str, str]] = [
        (list[Node], [Node("a"), Node("b", ["c"])], "encode",  # type: ignore[list-item]
         r"^\[1\]\['children'\]\[0\]: expected a Node, got str 'c'$"),
        (dict[str, int], {"n": "1"}, "decode", r"^\['n'\]: expected a whole number"),
        (tuple[int, str], [1], "decode", r"expected 2 values \(tuple\[int, str\]\)"),
        (Literal["a", 1], True, "encode", r"expected one of \['a', 1\], got bool True"),
        (Size, 3, "decode", r"expected a value of Size, got int 3"),
        (dt.date, AT, "encode", r"expected a date, got datetime"),
        (dt.datetime, "yesterday", "decode", r"expected a datetime as an ISO 8601 string"),
        (uuid.UUID, "not-a-uuid", "decode", r"expected a UUID as a string"),
        (Decimal, "1,5", "decode", r"expected a Decimal as a string, got str '1,5'"),
        (Node, {"name": "a", "size": 1}, "decode", r"Node has no field 'size'"),
        (Node, {}, "decode", r"Node: .*missing 1 required positional argument: 'name'"),
        (Point, {"x": "a", "at": "b"}, "decode", r"not a valid Point"),
        (Any, {1, 2}, "encode", r"is not JSON serializable"),
    ]
    for annotation, value, step, message in cases:
        with pytest.raises(TypeError, match=message):
            getattr(converter(annotation), step)(value)


def test_an_annotation_nothing_could_rebuild_is_refused_saying_what_would_do() -> None:
    class Money:
        pass

    with pytest.raises(TypeError, match=r"^amount: Money cannot be read back from JSON; use a "
                                        r"dataclass, a pydantic model"):
        converter(list[Money], where="amount")
    with pytest.raises(TypeError, match=r"keys are strings"):
        converter(dict[int, str])


#: What Decimal() reads and a typed Decimal refuses: not finite, past what
#: PostgreSQL's numeric holds, or not the digits str(Decimal) writes.
REFUSED_DECIMALS = ["Infinity", "-Infinity", "NaN", "sNaN", "1e999999999", "0E+999999999",
                    "1e131072", "1e-16384", " 12 ", "12\n", "1_000", "١٢"]


@pytest.mark.parametrize("text", REFUSED_DECIMALS, ids=range(len(REFUSED_DECIMALS)))
def test_a_decimal_is_finite_within_numeric_and_plain_digits(text: str) -> None:
    with pytest.raises(TypeError, match=r"^expected a (finite )?Decimal"):
        converter(Decimal).decode(text)
    with pytest.raises(TypeError):  # nor in a list, a union or a dataclass field
        converter(list[Decimal | None]).decode([text])


def test_the_decimals_at_the_bounds_and_in_every_plain_form_are_read() -> None:
    made = converter(Decimal)
    for text in ["1e131071", "1e-16383", "+12", "-0", ".5", "5.", "1E+3", "9.99"]:
        assert made.decode(text) == Decimal(text)
    for value in [Decimal("Infinity"), Decimal("sNaN"), Decimal("1e999999999"), 10**131072]:
        with pytest.raises(TypeError, match=r"^expected a (finite )?Decimal"):
            made.encode(value)  # what the decoder refuses, the encoder does not write


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 10**300, 10**5000],
                         ids=["2**63", "-2**63-1", "10**300", "10**5000"])
def test_an_int_is_a_bigint(value: int) -> None:
    """jsonb keeps a number exactly: `{"n": 1e300}` comes back as a 301-digit int."""
    for step in ("encode", "decode"):
        with pytest.raises(TypeError, match=r"from -2\*\*63 to 2\*\*63-1 \(a bigint\)"):
            getattr(converter(int), step)(value)
    bounds = [2**63 - 1, -(2**63)]
    assert [converter(int).decode(n) for n in bounds] == bounds


@pytest.mark.parametrize("digits", [400, 5000])
def test_an_int_no_float_can_hold_is_a_type_error(digits: int) -> None:
    value = 10 ** (digits - 1)
    for annotation in (float, float | str, float | None):
        for step in ("encode", "decode"):
            with pytest.raises(TypeError, match=r"got int of about [0-9,]+ digits$"):
                getattr(converter(annotation), step)(value)
    assert converter(float).decode(10**300) == 1e300  # jsonb's form of the float 1e300
    with pytest.raises(TypeError, match="expected a finite float"):
        converter(float).encode(float("nan"))
