"""Typed values to JSON and back, led by their annotations.

A task's arguments and result are stored as jsonb, like any payload; what
`codec.to_json` does one way (a Decimal to "9.99"), this module does both
ways for one annotation: `converter(Decimal)` checks that a value is a
Decimal, writes it as "9.99", and reads "9.99" back as `Decimal("9.99")`.
Everything is decided once, when a task is declared, so an annotation that
cannot be read back is a TypeError at the decorator, not a failed job a day
later.

==================================  =====================================
annotation                          JSON form (read back as)
==================================  =====================================
`int`, `float`, `str`, `bool`,      as is (`float` takes an int too); an
`None`                              int is a bigint, a float finite
`Decimal`                           string, every digit ("9.99"); an int
                                    is taken as a Decimal; finite, within
                                    PostgreSQL's numeric
`datetime`, `date`, `time`          ISO 8601 string
`UUID`                              string
an `Enum`                           its value
a dataclass                         object of its `__init__` fields, each
                                    by its own annotation
a pydantic model                    `model_dump(mode="json")`, read back
                                    with `model_validate`
`list[X]`, `tuple[X, ...]`,         array
`tuple[X, Y]`, `dict[str, X]`       object
`X | None`, `X | Y`, `Literal`      a union is read back by its first
                                    member that accepts the JSON
`Any`, no annotation                the JSON as is (`to_json` for
                                    encoding)
==================================  =====================================

A class of your own with none of these shapes is refused: make it a
dataclass or a pydantic model, or annotate it `Any` and read the JSON
yourself. (A type registered with `to_json` can go in, but nothing would
know how to rebuild it.)
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import math
import re
import types
import typing
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from jobqueue import codec

__all__ = ["Converter", "converter", "located", "type_hints"]


@dataclass(frozen=True)
class Converter:
    """How values of one annotation go to JSON (`encode`: TypeError when the
    value is not of it) and come back (`decode`: TypeError when the JSON does
    not fit). `name` is what error messages call it."""

    name: str
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]


def _fail(expected: str, value: Any) -> TypeError:
    if isinstance(value, int) and not isinstance(value, bool) and not _fits(value, 10**60):
        # repr() of an int past 4,300 digits is a ValueError: say its size instead
        digits = int(value.bit_length() * 0.30103) + 1
        shown = f"of about {digits:,} digits"
    else:
        shown = repr(value)
        if len(shown) > 60:
            shown = shown[:57] + "..."
    return TypeError(f"expected {expected}, got {type(value).__name__} {shown}")


def _fits(value: int, bound: int) -> bool:
    return -bound <= value < bound


def _checked(kind: type | tuple[type, ...], expected: str,
             refuse_bool: bool = False) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if not isinstance(value, kind) or (refuse_bool and isinstance(value, bool)):
            raise _fail(expected, value)
        return value
    return check


def _any_encode(value: Any) -> Any:
    try:
        codec.dumps(value)
    except (TypeError, ValueError) as e:
        raise TypeError(str(e)) from None
    return value


_ANY = Converter("any JSON value", _any_encode, lambda value: value)
_NONE = Converter("None", _checked(type(None), "None"), _checked(type(None), "null"))
_BOOL = Converter("bool", _checked(bool, "a bool"), _checked(bool, "a boolean"))
_STR = Converter("str", _checked(str, "a str"), _checked(str, "a string"))

#: An `int` is a signed 64-bit integer, PostgreSQL's bigint: jsonb keeps any
#: number exactly, so `{"n": 1e300}` arrives as a 301-digit int; a number
#: past this is a mistake, or one for `Decimal` or `str` (see `docs/tasks.md`).
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
#: A `Decimal` is one PostgreSQL's numeric can hold: at most 131,072 digits
#: before the point and 16,383 after (`1e999999999` costs 11 characters,
#: and neither numeric nor Python's default context, whose exponents stop at
#: 999,999, could do anything with it).
DECIMAL_DIGITS_BEFORE, DECIMAL_DIGITS_AFTER = 131_072, 16_383
# What a Decimal's string may be: the digits str(Decimal) writes (ASCII),
# a sign, a point, an exponent. Python's Decimal() also takes surrounding
# spaces, underscores, other scripts' digits, "Infinity", "NaN" and "sNaN".
_DECIMAL_TEXT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _int(expected: str) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _fail(expected, value)
        if not INT_MIN <= value <= INT_MAX:
            raise _fail(f"{expected} from -2**63 to 2**63-1 (a bigint)", value)
        return value
    return check


_INT = Converter("int", _int("an int"), _int("a whole number"))


def _float_encode(value: Any) -> float:
    """A float, or an int a float can hold (a float parameter takes both)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail("a float", value)
    try:
        number = float(value)
    except OverflowError:  # an int past 1.8e308
        raise _fail("a float (an int within a float's range)", value) from None
    if not math.isfinite(number):  # jsonb has no NaN nor infinity
        raise _fail("a finite float", value)
    return number


_FLOAT = Converter("float", _float_encode, _float_encode)


def _within(number: Decimal, value: Any) -> Decimal:
    """`number`, if finite and PostgreSQL's numeric could hold it."""
    if not number.is_finite():
        raise _fail("a finite Decimal", value)
    before = number.adjusted() + 1  # for a zero too: 0E+999999999
    after = max(0, -number.as_tuple().exponent)  # type: ignore[operator]
    if before > DECIMAL_DIGITS_BEFORE or after > DECIMAL_DIGITS_AFTER:
        raise _fail(f"a Decimal of at most {DECIMAL_DIGITS_BEFORE:,} digits before the "
                    f"point and {DECIMAL_DIGITS_AFTER:,} after", value)
    return number


def _decimal_encode(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, Decimal | int):
        raise _fail("a Decimal (or an int)", value)
    return str(_within(Decimal(value), value))


def _decimal_decode(value: Any) -> Decimal:
    if not isinstance(value, str) or not _DECIMAL_TEXT.fullmatch(value):
        raise _fail("a Decimal as a string", value)
    try:
        number = Decimal(value)
    except InvalidOperation:  # an exponent past what Decimal() reads
        raise _fail("a Decimal as a string", value) from None
    return _within(number, value)


_DECIMAL = Converter("Decimal", _decimal_encode, _decimal_decode)


def _iso(kind: type[dt.date] | type[dt.time], name: str) -> Converter:
    def encode(value: Any) -> str:
        # A datetime is a date: a `date` parameter takes only a date.
        if not isinstance(value, kind) or (kind is dt.date and isinstance(value, dt.datetime)):
            raise _fail(f"a {name}", value)
        return value.isoformat()

    def decode(value: Any) -> Any:
        if not isinstance(value, str):
            raise _fail(f"a {name} as an ISO 8601 string", value)
        try:
            return kind.fromisoformat(value)
        except ValueError:
            raise _fail(f"a {name} as an ISO 8601 string", value) from None
    return Converter(name, encode, decode)


def _uuid_decode(value: Any) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except (TypeError, ValueError, AttributeError):
        raise _fail("a UUID as a string", value) from None


def _uuid_encode(value: Any) -> str:
    if not isinstance(value, uuid.UUID):
        raise _fail("a UUID", value)
    return str(value)


_SIMPLE: dict[Any, Converter] = {
    Any: _ANY, object: _ANY, None: _NONE, type(None): _NONE, bool: _BOOL, int: _INT,
    float: _FLOAT, str: _STR, Decimal: _DECIMAL,
    dt.datetime: _iso(dt.datetime, "datetime"), dt.date: _iso(dt.date, "date"),
    dt.time: _iso(dt.time, "time"),
    uuid.UUID: Converter("UUID", _uuid_encode, _uuid_decode),
}


def converter(annotation: Any, *, where: str = "") -> Converter:
    """The converter for `annotation` (already resolved: a type, not a string),
    or a TypeError that names `where` and says what would do instead."""
    return _Builder(where).build(annotation)


class _Builder:
    """Builds converters, remembering the classes under construction so that a
    dataclass that holds itself (a tree) refers to its converter lazily."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.building: dict[type, Converter] = {}

    def build(self, annotation: Any) -> Converter:
        if annotation in _SIMPLE:
            return _SIMPLE[annotation]
        if isinstance(annotation, typing.NewType):
            return self.build(annotation.__supertype__)
        made = self._generic(annotation)
        if made is None and isinstance(annotation, type):
            made = self._class(annotation)
        if made is None:
            raise self._refuse(annotation, "use a dataclass, a pydantic model, a standard type "
                                           "(see jobqueue.typed), or Any for the JSON as is")
        return made

    def _generic(self, annotation: Any) -> Converter | None:
        """`list[int]`, `X | None`, `Literal[...]` and their kin (None: not one)."""
        origin = typing.get_origin(annotation) or annotation
        args = typing.get_args(annotation)
        if origin is typing.Annotated:
            return self.build(args[0])
        if origin is typing.Literal:
            return self._literal(args)
        if origin is typing.Union or origin is types.UnionType:
            return self._union([self.build(arg) for arg in args])
        if origin in (list, Sequence):
            return self._list(self.build(args[0] if args else Any), list)
        if origin is tuple:
            return self._tuple(args)
        if origin in (dict, Mapping):
            if args and args[0] is not str:
                raise self._refuse(annotation, "JSON object keys are strings: use dict[str, ...]")
            return self._dict(self.build(args[1] if args else Any))
        return None

    def _class(self, cls: type) -> Converter | None:
        if cls in self.building:
            return self.building[cls]
        if issubclass(cls, enum.Enum):
            return self._enum(cls)
        if dataclasses.is_dataclass(cls):
            return self._dataclass(cls)
        if callable(getattr(cls, "model_validate", None)):
            return self._pydantic(cls)
        return None

    def _refuse(self, annotation: Any, hint: str) -> TypeError:
        name = getattr(annotation, "__name__", None) or repr(annotation)
        where = f"{self.where}: " if self.where else ""
        return TypeError(f"{where}{name} cannot be read back from JSON; {hint}")

    @staticmethod
    def _literal(values: tuple[Any, ...]) -> Converter:
        def check(value: Any) -> Any:
            # type too: True == 1, but Literal[1] does not take True
            if not any(value == v and type(value) is type(v) for v in values):
                raise _fail(f"one of {list(values)!r}", value)
            return value
        return Converter(f"Literal{list(values)!r}", check, check)

    @staticmethod
    def _union(members: list[Converter]) -> Converter:
        name = " | ".join(member.name for member in members)

        def attempt(step: Callable[[Converter], Callable[[Any], Any]]) -> Callable[[Any], Any]:
            def run(value: Any) -> Any:
                for member in members:
                    try:
                        return step(member)(value)
                    except TypeError:
                        continue
                raise _fail(name, value)
            return run
        return Converter(name, attempt(lambda m: m.encode), attempt(lambda m: m.decode))

    @staticmethod
    def _list(item: Converter, kind: type) -> Converter:
        def encode(value: Any) -> list[Any]:
            if not isinstance(value, list | tuple):
                raise _fail(f"a list of {item.name}", value)
            return [_at(i, item.encode, v) for i, v in enumerate(value)]

        def decode(value: Any) -> Any:
            if not isinstance(value, list):
                raise _fail(f"an array of {item.name}", value)
            return kind(_at(i, item.decode, v) for i, v in enumerate(value))
        return Converter(f"list[{item.name}]", encode, decode)

    def _tuple(self, args: tuple[Any, ...]) -> Converter:
        if not args or (len(args) == 2 and args[1] is Ellipsis):
            return self._list(self.build(args[0] if args else Any), tuple)
        items = [self.build(arg) for arg in args]
        name = f"tuple[{', '.join(item.name for item in items)}]"

        def run(value: Any, step: str) -> Any:
            if not isinstance(value, list | tuple) or len(value) != len(items):
                raise _fail(f"{len(items)} values ({name})", value)
            pairs = enumerate(zip(items, value, strict=True))
            done = [_at(i, getattr(item, step), v) for i, (item, v) in pairs]
            return done if step == "encode" else tuple(done)
        return Converter(name, lambda v: run(v, "encode"), lambda v: run(v, "decode"))

    @staticmethod
    def _dict(item: Converter) -> Converter:
        def run(value: Any, step: Callable[[Any], Any]) -> dict[str, Any]:
            if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
                raise _fail(f"a dict of str to {item.name}", value)
            return {key: _at(key, step, v) for key, v in value.items()}
        return Converter(f"dict[str, {item.name}]", lambda v: run(v, item.encode),
                         lambda v: run(v, item.decode))

    @staticmethod
    def _enum(cls: type[enum.Enum]) -> Converter:
        def encode(value: Any) -> Any:
            if not isinstance(value, cls):
                raise _fail(f"a {cls.__name__}", value)
            return value.value

        def decode(value: Any) -> Any:
            try:
                return cls(value)
            except ValueError:
                raise _fail(f"a value of {cls.__name__}", value) from None
        return Converter(cls.__name__, encode, decode)

    def _dataclass(self, cls: type) -> Converter:
        fields: dict[str, Converter] = {}
        init: list[str] = []

        def encode(value: Any) -> dict[str, Any]:
            if not isinstance(value, cls):
                raise _fail(f"a {cls.__name__}", value)
            return {name: _at(name, fields[name].encode, getattr(value, name)) for name in init}

        def decode(value: Any) -> Any:
            if not isinstance(value, Mapping):
                raise _fail(f"a {cls.__name__} as an object", value)
            unknown = set(value) - set(fields)
            if unknown:
                raise TypeError(f"{cls.__name__} has no field {sorted(unknown)[0]!r}")
            try:  # a field with init=False is the class's to compute: left out
                return cls(**{name: _at(name, fields[name].decode, v)
                              for name, v in value.items() if name in init})
            except TypeError as e:
                if "argument" in str(e):  # a missing field, said by the dataclass's __init__
                    raise TypeError(f"{cls.__name__}: {e}") from None
                raise

        self.building[cls] = made = Converter(cls.__name__, encode, decode)
        hints = type_hints(cls, self.where)
        for field in dataclasses.fields(cls):
            fields[field.name] = self.build(hints.get(field.name, Any))
            if field.init:
                init.append(field.name)
        return made

    @staticmethod
    def _pydantic(cls: type) -> Converter:
        def encode(value: Any) -> Any:
            if not isinstance(value, cls):
                raise _fail(f"a {cls.__name__}", value)
            return value.model_dump(mode="json")  # type: ignore[attr-defined]

        def decode(value: Any) -> Any:
            try:
                return cls.model_validate(value)  # type: ignore[attr-defined]
            except ValueError as e:  # pydantic's ValidationError is a ValueError
                raise TypeError(f"not a valid {cls.__name__}: {e}") from None
        return Converter(cls.__name__, encode, decode)


def _at(where: object, step: Callable[[Any], Any], value: Any) -> Any:
    """`step(value)`, with `where` (a field, a key, an index) in its error."""
    try:
        return step(value)
    except TypeError as e:
        raise located(f"[{where!r}]", e) from None


def located(where: str, error: TypeError) -> TypeError:
    """`error` with `where` in front: `amount: expected ...`, or
    `lines[0]['price']: expected ...` when the error is deeper already."""
    text = str(error)
    return TypeError(f"{where}{text}" if text.startswith("[") else f"{where}: {text}")


def type_hints(obj: Any, where: str) -> dict[str, Any]:
    """Resolved annotations (`from __future__ import annotations` makes them
    strings), or a TypeError that says which name could not be found."""
    try:
        return typing.get_type_hints(obj, include_extras=True)
    except NameError as e:
        what = f"{where}: " if where else ""
        raise TypeError(f"{what}cannot resolve the annotations of "
                        f"{getattr(obj, '__qualname__', obj)!r}: {e}") from None

