"""Queue settings that every worker honours at once: pause, and limits on how
many jobs of a queue run at the same time and how many start per period.

They live in the database (`jobqueue_queues`), not in a worker's options, so
one command reaches the whole fleet; the claim statements read them as they
claim (`queries.sql`), so a worker that has not heard of a change yet still
keeps it. Only queues someone configured have a row: a queue back to no pause
and no limits loses its row, and its claims take the fast path again.

Like `enqueue`, each function runs in the caller's transaction (a SQLAlchemy
session or connection) and never commits; the change takes effect, and the
workers are told (NOTIFY), when that transaction commits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from jobqueue.enqueue import Executor, check_queue
from jobqueue.errors import shown
from jobqueue.schema.queries import queries

#: Seconds in each period a rate may be given per.
PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0}
#: Largest concurrency or rate count accepted (an integer column).
LIMIT_MAX = 1_000_000
_RATE = re.compile(r"^\s*(\d+)\s*/\s*([smh])\s*$")


class _Keep:
    def __repr__(self) -> str:
        return "KEEP"


#: Leave this setting as it is (`limit(s, "q", rate=...)` keeps the concurrency).
KEEP: Any = _Keep()


@dataclass(frozen=True)
class Rate:
    """At most `limit` jobs started per `period` seconds."""

    limit: int
    period: float

    def __str__(self) -> str:
        unit = next((u for u, seconds in PERIODS.items() if seconds == self.period), None)
        return f"{self.limit}/{unit}" if unit else f"{self.limit}/{self.period:g}s"


def parse_rate(value: object) -> Rate:
    """"20/s", "100/m", "1000/h", or a Rate; a ValueError saying what is wrong."""
    if isinstance(value, Rate):
        return check_rate(value)
    if not isinstance(value, str):
        raise ValueError(f"rate must look like 20/s, 100/m or 1000/h, not {shown(value)}")
    match = _RATE.match(value)
    if not match:
        raise ValueError(f"rate {shown(value)} must look like 20/s, 100/m or 1000/h "
                         "(a whole number of jobs per second, minute or hour)")
    return check_rate(Rate(int(match.group(1)), PERIODS[match.group(2)]))


def check_rate(rate: Rate) -> Rate:
    if isinstance(rate.limit, bool) or not isinstance(rate.limit, int) \
            or not 1 <= rate.limit <= LIMIT_MAX:
        raise ValueError(f"rate must allow 1 to {LIMIT_MAX:,} jobs per period, "
                         f"not {shown(rate.limit)}")
    if not 0 < rate.period <= 86_400:
        raise ValueError(f"rate period must be over 0 and at most a day, not {shown(rate.period)}")
    return rate


def check_concurrency(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"concurrency must be a whole number, not {shown(value)}")
    if not 1 <= value <= LIMIT_MAX:
        raise ValueError(f"concurrency must be between 1 and {LIMIT_MAX:,}, not {value} "
                         "(to remove the limit, pass None)")
    return value


async def pause(session: Executor, queue: str) -> None:
    """Start nothing new from `queue`, on any worker; running jobs finish."""
    await _set_paused(session, queue, True)


async def resume(session: Executor, queue: str) -> None:
    """Let workers start jobs from `queue` again."""
    await _set_paused(session, queue, False)


async def limit(session: Executor, queue: str, *, concurrency: int | None = KEEP,
                rate: Rate | str | None = KEEP) -> None:
    """Set or remove (None) a queue's fleet-wide limits; KEEP leaves one as it is.

    concurrency: at most this many of its jobs running at once, across every
        worker (jobs count from their claim to their outcome).
    rate: at most `rate.limit` of its jobs started in each window of
        `rate.period` seconds, windows aligned to the database's clock.
    """
    check_queue(queue)
    params = {
        "queue": queue,
        "set_concurrency": concurrency is not KEEP,
        "concurrency": None if concurrency is KEEP or concurrency is None
        else check_concurrency(concurrency),
        "set_rate": rate is not KEEP,
        "rate_limit": None,
        "rate_period": None,
    }
    if rate is not KEEP and rate is not None:
        parsed = parse_rate(rate)
        params["rate_limit"], params["rate_period"] = parsed.limit, parsed.period
    await session.execute(queries["queue_set_limits"].text, params)
    await session.execute(queries["queue_forget_plain"].text, {"queue": queue})


async def _set_paused(session: Executor, queue: str, paused: bool) -> None:
    check_queue(queue)
    await session.execute(queries["queue_set_paused"].text, {"queue": queue, "paused": paused})
    await session.execute(queries["queue_forget_plain"].text, {"queue": queue})
