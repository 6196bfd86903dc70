"""Recurring handlers for tests that run real worker processes
(`--import tests.schedule_handlers`). Never imported by the test process
itself: its registry would then fire these in every in-process worker."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from jobqueue.registry import handlers

#: Job types, as the tests name them without importing this module.
EVERY_SECOND = "every_second"
HOURLY = "hourly"


@handlers.register(EVERY_SECOND, every=1)
async def every_second(session: AsyncSession, payload: dict[str, Any]) -> dict[str, Any]:
    return {"tick": payload["tick"]}


@handlers.register(HOURLY, every=3600)
async def hourly(session: AsyncSession, payload: dict[str, Any]) -> dict[str, Any]:
    return {"tick": payload["tick"]}
