"""Putting jobs in the queue, inside the caller's transaction.

`enqueue` runs on whatever session or connection the caller passes and never
commits: the job becomes visible when, and only if, the caller's transaction
commits. That is what makes "save the order and queue its e-mail" atomic.

Everything is validated here, before PostgreSQL would have to reject it, so a
bad job is a clear `ValueError` and nothing is written.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from jobqueue.registry import check_job_type
from jobqueue.schema.queries import queries

#: Retries beyond this are surely a mistake (and must fit an integer column).
MAX_RETRIES_LIMIT = 1000
#: A job's payload is a message, not a file: keep it under this many bytes.
PAYLOAD_MAX_BYTES = 1_000_000

Executor = AsyncSession | AsyncConnection


def check_max_retries(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"max_retries must be a whole number, not {value!r}")
    if not 0 <= value <= MAX_RETRIES_LIMIT:
        raise ValueError(f"max_retries must be between 0 and {MAX_RETRIES_LIMIT}, not {value}")
    return value


def check_run_at(value: object) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise ValueError(f"run_at must be a datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("run_at must carry a time zone (for example 2030-01-01T09:00:00+00:00)")
    try:
        value.astimezone(UTC)
    except OverflowError:
        raise ValueError(f"run_at is out of range: {value.isoformat()}") from None
    return value


def check_strings(value: Any, path: str) -> None:
    """PostgreSQL's jsonb cannot hold NUL characters; find them before it does."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError(f"{path} contains a NUL character, which PostgreSQL rejects")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            check_strings(key, path)
            check_strings(item, f"{path}[{key!r}]")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            check_strings(item, f"{path}[{i}]")


def encode_payload(payload: object) -> str:
    """The payload as JSON text for a jsonb column, or a ValueError."""
    if payload is None:
        payload = {}
    if not isinstance(payload, Mapping):
        raise ValueError(f"payload must be a JSON object (a dict), not {type(payload).__name__}")
    try:
        encoded = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise ValueError(f"payload is not valid JSON: {e}") from None
    try:
        size = len(encoded.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError("payload contains a lone surrogate, which is not valid Unicode") from None
    if size > PAYLOAD_MAX_BYTES:
        raise ValueError(f"payload is {size:,} bytes; the limit is {PAYLOAD_MAX_BYTES:,}")
    check_strings(payload, "payload")
    return encoded


async def enqueue(
    session: Executor,
    job_type: str,
    payload: Mapping[str, Any] | None = None,
    *,
    max_retries: int = 3,
    run_at: datetime | None = None,
) -> uuid.UUID:
    """Add one job in the caller's transaction and return its id.

    `run_at` (timezone-aware) delays the job; it is compared with the
    database's clock, not this machine's.
    """
    params = {
        "job_type": check_job_type(job_type),
        "payload": encode_payload(payload),
        "max_retries": check_max_retries(max_retries),
        "run_at": check_run_at(run_at),
    }
    result = await session.execute(queries["enqueue"].text, params)
    job_id: uuid.UUID = result.scalar_one()
    return job_id


async def enqueue_many(
    session: Executor,
    job_type: str,
    payloads: Iterable[Mapping[str, Any]],
    *,
    max_retries: int = 3,
    run_at: datetime | None = None,
) -> list[uuid.UUID]:
    """Add many jobs of one type in one statement; ids in the payloads' order.

    All payloads are validated before anything is sent, so one bad payload
    writes nothing.
    """
    params = {
        "job_type": check_job_type(job_type),
        "max_retries": check_max_retries(max_retries),
        "run_at": check_run_at(run_at),
    }
    encoded = []
    for i, payload in enumerate(payloads):
        try:
            encoded.append(encode_payload(payload))
        except ValueError as e:
            raise ValueError(f"payload #{i}: {e}") from None
    if not encoded:
        return []
    result = await session.execute(queries["enqueue_many"].text, {**params, "payloads": encoded})
    return list(result.scalars())
