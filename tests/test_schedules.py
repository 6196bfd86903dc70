"""Recurring jobs: the calendar (pure) and registration's checks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from jobqueue import HandlerRegistry
from jobqueue.schedules import ScheduleSpec, tick_text


def at(iso: str) -> datetime:
    return datetime.fromisoformat(iso).replace(tzinfo=UTC)


async def noop(session: Any, payload: dict[str, Any]) -> None:
    return None


def registry_with(job_type: str, **schedule: Any) -> HandlerRegistry:
    registry = HandlerRegistry()
    registry.register(job_type, **schedule)(noop)
    return registry


# -- the calendar -----------------------------------------------------------------


@pytest.mark.parametrize(("now", "latest", "following"), [
    ("2026-12-01T10:00:00", "2026-12-01T03:00:00", "2026-12-02T03:00:00"),
    ("2026-12-01T03:00:00", "2026-12-01T03:00:00", "2026-12-02T03:00:00"),  # a tick is its own
    ("2026-12-01T02:59:59.999999", "2026-11-30T03:00:00", "2026-12-01T03:00:00"),
    ("2026-12-01T03:00:00.5", "2026-12-01T03:00:00", "2026-12-02T03:00:00"),
    ("2027-01-01T00:00:00", "2026-12-31T03:00:00", "2027-01-01T03:00:00"),  # across a year
    ("2028-03-01T01:00:00", "2028-02-29T03:00:00", "2028-03-01T03:00:00"),  # a leap day
    # 29 March 2026: Europe's clocks go forward; UTC's do not, nor do its ticks.
    ("2026-03-29T12:00:00", "2026-03-29T03:00:00", "2026-03-30T03:00:00"),
])
def test_the_latest_and_next_tick_of_a_daily_cron(now: str, latest: str, following: str
                                                   ) -> None:
    spec = ScheduleSpec(cron="0 3 * * *")
    assert spec.latest_tick(at(now)) == at(latest)
    assert spec.next_tick(at(now)) == at(following)


def test_cron_is_read_in_utc_whatever_the_zone_of_now() -> None:
    tokyo = datetime.fromisoformat("2026-12-01T11:59:00+09:00")  # 02:59 UTC
    assert ScheduleSpec(cron="0 3 * * *").latest_tick(tokyo) == at("2026-11-30T03:00:00")


def test_cron_fields_and_names() -> None:
    weekdays = ScheduleSpec(cron="30 9 * * mon-fri")
    assert weekdays.latest_tick(at("2026-12-06T12:00:00")) == at("2026-12-04T09:30:00")  # Sun→Fri
    assert ScheduleSpec(cron=" */15  *  * * * ").text == "*/15 * * * *"


@pytest.mark.parametrize(("every", "now", "latest"), [
    (60, "2026-12-01T10:00:59.9", "2026-12-01T10:00:00"),
    (3600, "2026-12-01T10:59:59", "2026-12-01T10:00:00"),
    (86_400, "2026-12-01T10:00:00", "2026-12-01T00:00:00"),
    (1, "2026-12-01T10:00:07.25", "2026-12-01T10:00:07"),
    (7, "1970-01-01T00:00:20", "1970-01-01T00:00:14"),  # aligned to the epoch
])
def test_intervals_tick_on_multiples_of_every_since_the_epoch(every: int, now: str,
                                                               latest: str) -> None:
    spec = ScheduleSpec(every=every)
    assert spec.latest_tick(at(now)) == at(latest)
    assert spec.next_tick(at(now)) == at(latest) + timedelta(seconds=every)
    assert spec.text == f"every {every}s"


def test_a_tick_as_text_is_iso_8601_in_utc() -> None:
    assert tick_text(at("2026-12-01T03:00:00")) == "2026-12-01T03:00:00+00:00"


# -- registration -------------------------------------------------------------------


@pytest.mark.parametrize(("schedule", "message"), [
    ({"cron": "61 * * * *"}, "cron expression '61 * * * *' is not valid: bad minute"),
    ({"cron": "0 24 * * *"}, "is not valid: bad hour"),
    ({"cron": "0 0 31 2 *"}, "is not valid: bad day-of-month"),
    ({"cron": "5-1 * * * *"}, "is not valid: bad minute"),
    ({"cron": "not cron"}, "has 2 field(s); it needs 5 (minute hour day-of-month month "
                           "day-of-week, in UTC)"),
    ({"cron": "* * * * * *"}, "for seconds, use every="),
    ({"cron": ""}, "has 0 field(s)"),
    ({"cron": 5}, "cron must be a string"),
    ({"every": 0}, "every must be between 1 and"),
    ({"every": -1}, "every must be between 1 and"),
    ({"every": 1.5}, "every must be a whole number of seconds, not 1.5"),
    ({"every": True}, "whole number"),
    ({"every": "60"}, "whole number"),
    ({"every": 10**9}, "every must be between 1 and"),
    ({"cron": "0 3 * * *", "every": 60}, "cron= or every=, not both"),
    ({"every": 60, "queue": "no spaces"}, "is not a valid name"),
    ({"every": 60, "priority": 5000}, "priority must be between"),
    ({"queue": "reports"}, "queue and priority apply to scheduled jobs"),
    ({"priority": 1}, "queue and priority apply to scheduled jobs"),
])
def test_a_bad_schedule_is_one_line_at_registration_and_nothing_is_kept(
    schedule: dict[str, Any], message: str
) -> None:
    registry = HandlerRegistry()
    with pytest.raises(ValueError) as raised:
        registry.register("nightly", **schedule)(noop)
    text = str(raised.value)
    assert message in text and "\n" not in text and len(text) < 200
    assert "nightly" not in registry and not registry.schedules


def test_registration_keeps_the_schedule_beside_the_handler() -> None:
    registry = registry_with("nightly", cron="0 3 * * *", queue="reports", priority=5)
    registry.register("plain")(noop)
    assert "nightly" in registry and "plain" in registry
    assert dict(registry.schedules) == {
        "nightly": ScheduleSpec(cron="0 3 * * *", queue="reports", priority=5)}
    registry.register("nightly")(noop)  # registered again without one: no longer recurs
    assert not registry.schedules
    registry.register("nightly", every=60)(noop)
    registry.remove("nightly")
    assert not registry.schedules and "nightly" not in registry
