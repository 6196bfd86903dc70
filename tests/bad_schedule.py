"""A handler module whose schedule is not a cron expression
(`--import tests.bad_schedule`): the worker must refuse it in one line."""

from __future__ import annotations

from typing import Any

from jobqueue.registry import handlers


@handlers.register("bad_schedule", cron="61 * * * *")
async def bad_schedule(session: Any, payload: dict[str, Any]) -> None:
    return None
