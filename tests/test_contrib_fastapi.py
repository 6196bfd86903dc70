"""`jobqueue.contrib.fastapi`: the lifespan runs a worker for the app's life
and stops it with the app; a worker that could run nothing stops the app
from starting. (The example app under uvicorn, SIGTERM included, is in
test_examples.py.)"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from jobqueue import HandlerRegistry, db, enqueue
from jobqueue.contrib.fastapi import lifespan, running_worker
from jobqueue.testing import wait_for


async def test_the_lifespan_runs_a_worker_for_the_apps_life(
    engine: AsyncEngine, conn: asyncpg.Connection
) -> None:
    registry = HandlerRegistry()
    ran = asyncio.Event()

    @registry.register("ping")
    async def ping(session: Any, payload: dict[str, Any]) -> str:
        ran.set()
        return "pong"

    app = FastAPI()
    async with lifespan(engine, registry=registry, concurrency=1)(app):
        worker = app.state.jobqueue_worker
        await asyncio.wait_for(worker.wait_active(), 30)
        async with engine.begin() as s:
            await enqueue(s, "ping")
        await asyncio.wait_for(ran.wait(), 30)

        async def done() -> bool:
            return await conn.fetchval("SELECT status FROM jobs") == "completed"
        await wait_for(done, timeout=30, message="the ping job completing")
        assert worker.role == "active"
    assert worker.state == "stopped"
    assert await conn.fetchval("SELECT count(*) FROM jobqueue_workers") == 0  # it left


async def test_a_worker_that_could_run_nothing_stops_the_app_starting(db_url: str) -> None:
    with pytest.raises(db.ConfigError, match="no handlers are registered"):
        async with running_worker(db_url, registry=HandlerRegistry()):
            pass
    registry = HandlerRegistry()
    registry.add("x", lambda session, payload: None)
    with pytest.raises(ValueError, match="concurrency"):
        async with running_worker(db_url, registry=registry, concurrency=0):
            pass
