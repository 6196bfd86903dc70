"""Putting jobs in the queue, inside the caller's transaction.

`enqueue` runs on whatever session or connection the caller passes and never
commits: the job becomes visible when, and only if, the caller's transaction
commits. That is what makes "save the order and queue its e-mail" atomic.

Everything is validated here, before PostgreSQL would have to reject it, so a
bad job is a clear `ValueError` and nothing is written.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, NamedTuple

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from jobqueue import codec, tracing
from jobqueue.errors import shown
from jobqueue.schema.models import (
    DEFAULT_QUEUE,
    JOB_TYPE_MAX_LENGTH,
    PRIORITY_MAX,
    PRIORITY_MIN,
    QUEUE_NAME_PATTERN,
    TIMEOUT_MAX,
    UNIQUE_KEY_MAX_LENGTH,
)
from jobqueue.schema.queries import queries

#: Retries beyond this are surely a mistake (and must fit an integer column).
MAX_RETRIES_LIMIT = 1000
#: A job's payload is a message, not a file: keep it under this many bytes.
PAYLOAD_MAX_BYTES = 1_000_000

Executor = AsyncSession | AsyncConnection


#: What a job type must not hold, and what text output shows escaped
#: (`jobqueue.ops.logs.printable`): C0 and C1 controls, DEL, and the bidi
#: embeddings, overrides and isolates; and what shows nothing, or breaks a
#: line where none is seen (issue 49): the line and paragraph separators
#: (which `str.splitlines` and JavaScript break at), the bidi marks
#: (U+061C, U+200E, U+200F), and Unicode's other invisible format
#: characters: zero-width spaces and joiners, the soft hyphen, the word
#: joiner and invisible operators, the byte order mark, the interlinear
#: annotations and the tag characters. Two job types that look the same
#: are then the same job type.
CONTROL_CHARACTERS = (*range(0x20), *range(0x7F, 0xA0), *range(0x202A, 0x202F),
                      *range(0x2066, 0x206A),
                      0xAD, 0x61C, 0x180E, *range(0x200B, 0x2010), 0x2028, 0x2029,
                      *range(0x2060, 0x2065), *range(0x206A, 0x2070), 0xFEFF,
                      *range(0xFFF9, 0xFFFC), *range(0xE0000, 0xE0080))
_CONTROL = re.compile("[" + "".join(map(chr, CONTROL_CHARACTERS)) + "]")


def check_job_type(job_type: object) -> str:
    """The job type, or a ValueError that says what is wrong with it."""
    if not isinstance(job_type, str):
        raise ValueError(f"job type must be a string, not {type(job_type).__name__}")
    if not job_type.strip():
        raise ValueError("job type must not be empty")
    if len(job_type) > JOB_TYPE_MAX_LENGTH:
        raise ValueError(
            f"job type is {len(job_type)} characters long; the limit is {JOB_TYPE_MAX_LENGTH}"
        )
    if "\x00" in job_type:
        raise ValueError("job type must not contain NUL characters")
    if _CONTROL.search(job_type):
        # A newline forges a line in a text log; an escape sequence rewrites
        # the terminal that shows it; a bidi override reorders what it says.
        raise ValueError("job type must not contain control characters or invisible ones "
                         "(newlines, escapes, bidi overrides and marks, line separators, "
                         "zero-width spaces)")
    try:
        job_type.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("job type contains a lone surrogate, which is not valid Unicode") from None
    return job_type


def check_max_retries(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"max_retries must be a whole number, not {shown(value)}")
    if not 0 <= value <= MAX_RETRIES_LIMIT:
        raise ValueError(f"max_retries must be between 0 and {MAX_RETRIES_LIMIT}, not {value}")
    return value


_QUEUE_NAME = re.compile(QUEUE_NAME_PATTERN)


def check_queue(value: object) -> str:
    """A queue name, or a ValueError saying what is wrong with it."""
    if not isinstance(value, str):
        raise ValueError(f"queue must be a string, not {type(value).__name__}")
    if not _QUEUE_NAME.fullmatch(value):
        raise ValueError(f"queue {shown(value)} is not a valid name: 1 to 64 letters, digits "
                         "or the characters _ . : -")
    return value


def check_priority(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"priority must be a whole number, not {shown(value)}")
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise ValueError(f"priority must be between {PRIORITY_MIN} and {PRIORITY_MAX}, "
                         f"not {value}")
    return value


def check_unique_key(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"unique_key must be a string, not {type(value).__name__}")
    if not value:
        raise ValueError("unique_key must not be empty (leave it out for no key)")
    if len(value) > UNIQUE_KEY_MAX_LENGTH:
        raise ValueError(f"unique_key is {len(value)} characters long; "
                         f"the limit is {UNIQUE_KEY_MAX_LENGTH}")
    check_strings(value, "unique_key")
    return value


def check_timeout(value: object, what: str = "timeout") -> float | None:
    """Seconds one attempt may run (None: no limit), or a ValueError. A bool is
    refused (True is not a duration), and so are NaN, infinity, zero or less,
    and more than a year (TIMEOUT_MAX): a mistake of units, not a timeout."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a number of seconds, not {shown(value)}")
    if not 0 < value <= TIMEOUT_MAX:  # NaN compares false, so it is refused here too
        raise ValueError(f"{what} must be more than 0 and at most {TIMEOUT_MAX:,} seconds "
                         f"(a year), not {shown(value)}")
    return float(value)


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


def check_nul(encoded: str, path: str) -> None:
    """No NUL in JSON text bound for jsonb. Looked for in the text, which holds
    what `to_json` made of the values too; located only when one is there."""
    if "\\u0000" in encoded:
        check_strings(json.loads(encoded), path)


def encode_payload(payload: object) -> str:
    """The payload as JSON text for a jsonb column, or a ValueError."""
    if payload is None:
        payload = {}
    if not isinstance(payload, Mapping):
        raise ValueError(f"payload must be a JSON object (a dict), not {type(payload).__name__}")
    try:
        encoded = codec.dumps(payload)
    except (TypeError, ValueError) as e:
        raise ValueError(f"payload is not valid JSON: {e}") from None
    try:
        size = len(encoded.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError("payload contains a lone surrogate, which is not valid Unicode") from None
    if size > PAYLOAD_MAX_BYTES:
        raise ValueError(f"payload is {size:,} bytes; the limit is {PAYLOAD_MAX_BYTES:,}")
    check_nul(encoded, "payload")
    return encoded


class Enqueued(NamedTuple):
    """What `try_enqueue` did: the job's id, and whether this call made it
    (False: an unfinished job already held the unique key; `id` is that job's)."""

    id: uuid.UUID
    created: bool


async def enqueue(
    session: Executor,
    job_type: str,
    payload: Mapping[str, Any] | None = None,
    *,
    max_retries: int = 3,
    run_at: datetime | None = None,
    queue: str = DEFAULT_QUEUE,
    priority: int = 0,
    unique_key: str | None = None,
    timeout: float | None = None,
) -> uuid.UUID:
    """Add one job in the caller's transaction and return its id.

    `run_at` (timezone-aware) delays the job; it is compared with the
    database's clock, not this machine's. `queue` routes it (workers serve
    some queues, or all); `priority`: higher runs first among its queue's due
    jobs (-1000 to 1000). `timeout`: seconds one attempt may run before the
    worker cancels it (None: the job type's default from `register(...,
    timeout=)`, if any).

    `unique_key`: while an unfinished job (pending, processing, retrying) holds
    the key, nothing is written and that job's id comes back. The database's
    unique index decides, so concurrent enqueues of one key from many
    connections make one job. If another transaction holding the key has not
    committed yet, this waits for it. In a REPEATABLE READ or SERIALIZABLE
    transaction a key taken by a transaction that committed after this one
    began raises a serialization failure instead: retry the transaction.
    """
    return (await try_enqueue(session, job_type, payload, max_retries=max_retries,
                              run_at=run_at, queue=queue, priority=priority,
                              unique_key=unique_key, timeout=timeout)).id


async def try_enqueue(
    session: Executor,
    job_type: str,
    payload: Mapping[str, Any] | None = None,
    *,
    max_retries: int = 3,
    run_at: datetime | None = None,
    queue: str = DEFAULT_QUEUE,
    priority: int = 0,
    unique_key: str | None = None,
    timeout: float | None = None,
) -> Enqueued:
    """`enqueue`, saying whether the job is new or the unique key's holder:
    for callers that must tell their own user (the CLI, the HTTP API)."""
    params = {
        "job_type": check_job_type(job_type),
        "payload": encode_payload(payload),
        "max_retries": check_max_retries(max_retries),
        "run_at": check_run_at(run_at),
        "queue": check_queue(queue),
        "priority": check_priority(priority),
        "unique_key": check_unique_key(unique_key),
        "timeout": check_timeout(timeout),
    }
    with tracing.producing(job_type, queue) as produced:
        params["trace_context"] = produced.context
        enqueued = await _insert_or_find(session, params)
        produced.sent([enqueued.id])
    return enqueued


async def _insert_or_find(session: Executor, params: dict[str, Any]) -> Enqueued:
    # A key's holder can finish between the two statements: then insert again.
    unique_key = params["unique_key"]
    for _ in range(_UNIQUE_ATTEMPTS):
        job_id: uuid.UUID | None = (
            await session.execute(queries["enqueue"].text, params)).scalar_one_or_none()
        if job_id is not None:
            return Enqueued(job_id, True)
        job_id = (await session.execute(queries["find_unique"].text,
                                        {"unique_key": unique_key})).scalar_one_or_none()
        if job_id is not None:
            return Enqueued(job_id, False)
    raise RuntimeError(f"unique key {unique_key!r} changed hands {_UNIQUE_ATTEMPTS} times "
                       "while enqueuing; try again")


#: Rounds of insert-or-find before giving up on a key that keeps changing hands.
_UNIQUE_ATTEMPTS = 5


async def enqueue_many(
    session: Executor,
    job_type: str,
    payloads: Iterable[Mapping[str, Any]],
    *,
    max_retries: int = 3,
    run_at: datetime | None = None,
    queue: str = DEFAULT_QUEUE,
    priority: int = 0,
    timeout: float | None = None,
) -> list[uuid.UUID]:
    """Add many jobs of one type in one statement; ids in the payloads' order.

    All payloads are validated before anything is sent, so one bad payload
    writes nothing. (No unique keys here: one statement cannot both insert
    and report which keys were held; use `enqueue` for keyed jobs.)
    """
    params = {
        "job_type": check_job_type(job_type),
        "max_retries": check_max_retries(max_retries),
        "run_at": check_run_at(run_at),
        "queue": check_queue(queue),
        "priority": check_priority(priority),
        "timeout": check_timeout(timeout),
    }
    encoded = []
    for i, payload in enumerate(payloads):
        try:
            encoded.append(encode_payload(payload))
        except ValueError as e:
            raise ValueError(f"payload #{i}: {e}") from None
    if not encoded:
        return []
    with tracing.producing(job_type, queue, len(encoded)) as produced:
        result = await session.execute(queries["enqueue_many"].text, {
            **params, "payloads": encoded, "trace_context": produced.context})
        ids = list(result.scalars())
        produced.sent(ids)
    return ids
