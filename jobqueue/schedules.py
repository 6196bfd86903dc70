"""Recurring jobs: what a schedule is, and when its ticks fall.

    @handlers.register("nightly_report", cron="0 3 * * *")   # 03:00 UTC every day
    @handlers.register("refresh_cache", every=60)              # every minute, on the minute

A schedule is a cron expression of five fields (minute, hour, day of month,
month, day of week), evaluated in UTC, or an interval of whole seconds whose
ticks are aligned to the Unix epoch: `every=3600` ticks on the hour and
`every=86400` at midnight UTC, whichever worker computes them, so a tick is
the same instant for the whole fleet. Every time here is UTC: a server's or a
user's time zone never shifts a tick, and no tick is skipped or doubled when
a clock changes for daylight saving time.

The maintenance leader turns ticks into jobs (`worker/scheduler.py`); this
module only knows the calendar, and computes from whatever "now" it is given
(the leader gives it the database's).

Cron expressions are parsed and evaluated by cronsim, chosen over croniter
(also maintained again, by pallets-eco) because it refuses at parse time what
croniter 7 accepts and then fails on, or guesses at, later: `0 0 31 2 *` (no
such day; croniter's `strict=True` catches that one), a reversed range `5-1`,
the random `R`; because it evaluates like Debian's cron, DST transitions included,
which a future `tz=` option could rely on; and because it is pure Python with
no dependencies (croniter needs python-dateutil). Only five fields are taken:
the two libraries read a sixth field as seconds at opposite ends, so a
six-field expression would mean different things to different readers; a
schedule finer than a minute is `every=`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cronsim import CronSim, CronSimError

from jobqueue.enqueue import check_priority, check_queue
from jobqueue.schema.models import DEFAULT_QUEUE, SCHEDULE_MAX_LENGTH

#: The fields of a cron expression, in order.
CRON_FIELDS = ("minute", "hour", "day-of-month", "month", "day-of-week")
#: The longest interval accepted: rarer jobs say when with a cron expression.
EVERY_MAX = 366 * 86_400
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SECOND = timedelta(seconds=1)


@dataclass(frozen=True)
class ScheduleSpec:
    """When a job type recurs (cron or every, exactly one of them), and the
    queue and priority its jobs get. Checked when built: a bad one is a
    ValueError of one line, raised where it is registered."""

    cron: str | None = None
    every: int | None = None
    queue: str = DEFAULT_QUEUE
    priority: int = 0

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every is None):
            raise ValueError("a schedule takes cron= or every=, not both" if self.cron is not None
                             else "a schedule needs cron= or every=")
        if self.cron is not None:
            object.__setattr__(self, "cron", check_cron(self.cron))
        else:
            check_every(self.every)
        check_queue(self.queue)
        check_priority(self.priority)

    @property
    def text(self) -> str:
        """The schedule as its database row records it: `0 3 * * *`, `every 60s`."""
        return self.cron if self.cron is not None else f"every {self.every}s"

    def latest_tick(self, now: datetime) -> datetime | None:
        """The latest tick at or before `now` (None: none in the last 50
        years, which only a cron expression of rare dates can have)."""
        if self.every is not None:
            seconds = (now - _EPOCH) // _SECOND
            return _EPOCH + timedelta(seconds=seconds - seconds % self.every)
        # cronsim steps one second back before it searches: start a second
        # ahead (whole seconds), so a tick exactly at `now` counts.
        start = now.astimezone(UTC).replace(microsecond=0) + _SECOND
        return next(CronSim(str(self.cron), start, reverse=True), None)

    def next_tick(self, now: datetime) -> datetime | None:
        """The first tick after `now` (None: none in the next 50 years)."""
        if self.every is not None:
            latest = self.latest_tick(now)
            assert latest is not None
            return latest + timedelta(seconds=self.every)
        return next(CronSim(str(self.cron), now.astimezone(UTC)), None)


def check_cron(expr: object) -> str:
    """A cron expression of five fields that fires at some time, with its
    spacing tidied; a ValueError saying what is wrong otherwise."""
    if not isinstance(expr, str):
        raise ValueError(f"cron must be a string such as '0 3 * * *', not {type(expr).__name__}")
    fields = expr.split()
    if len(fields) != len(CRON_FIELDS):
        hint = "; for seconds, use every=" if len(fields) == len(CRON_FIELDS) + 1 else ""
        raise ValueError(f"cron expression {expr[:80]!r} has {len(fields)} field(s); it needs 5 "
                         f"({' '.join(CRON_FIELDS)}, in UTC){hint}")
    tidy = " ".join(fields)
    if len(tidy) > SCHEDULE_MAX_LENGTH:
        raise ValueError(f"cron expression is {len(tidy)} characters long; "
                         f"the limit is {SCHEDULE_MAX_LENGTH}")
    now = datetime.now(UTC)
    try:
        fires = (next(CronSim(tidy, now), None) is not None
                 or next(CronSim(tidy, now, reverse=True), None) is not None)
    except CronSimError as e:
        reason = str(e)
        raise ValueError(f"cron expression {tidy!r} is not valid: "
                         f"{reason[:1].lower()}{reason[1:]}") from None
    if not fires:
        raise ValueError(f"cron expression {tidy!r} never fires (no time matches it within "
                         "50 years)")
    return tidy


def check_every(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"every must be a whole number of seconds, not {value!r}")
    if not 1 <= value <= EVERY_MAX:
        raise ValueError(f"every must be between 1 and {EVERY_MAX:,} seconds (366 days), "
                         f"not {value}")
    return value


def tick_text(tick: datetime) -> str:
    """A tick as ISO 8601 in UTC: the job's payload and unique key carry it."""
    return tick.astimezone(UTC).isoformat()
