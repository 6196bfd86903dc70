"""Every failure explains itself: a failed attempt keeps its traceback in the
job's history (bounded), logged once at WARNING, and shown by `jobqueue
status ID`, the API and the dashboard's job page."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Callable
from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from jobqueue import HandlerRegistry, RetryPolicy, enqueue
from jobqueue.ops.cli import format_job
from jobqueue.ops.logs import formatter
from jobqueue.ops.status import job_detail
from jobqueue.schema.models import TRACEBACK_MAX_LENGTH
from jobqueue.testing import drain
from jobqueue.worker.handler import traceback_text


def _width(options: dict[str, Any]) -> int:
    return int(options["width"])  # the line a reader must find: KeyError: 'width'


def registry() -> HandlerRegistry:
    made = HandlerRegistry()

    @made.register("resize")
    async def resize(session: Any, payload: dict[str, Any]) -> None:
        _width(payload)

    @made.register("resize_sync")
    def resize_sync(session: Any, payload: dict[str, Any]) -> None:
        _width(payload)

    return made


async def history(conn: asyncpg.Connection, job_id: uuid.UUID) -> list[dict[str, Any]]:
    return json.loads(await conn.fetchval("SELECT error_history FROM jobs WHERE id = $1",
                                          job_id))


@pytest.mark.parametrize("job_type", ["resize", "resize_sync"])
async def test_each_failed_attempt_keeps_its_traceback_and_logs_it_once(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection,
        caplog: pytest.LogCaptureFixture, job_type: str) -> None:
    async with engine.begin() as s:
        job_id = await enqueue(s, job_type, {}, max_retries=1)
    with caplog.at_level(logging.WARNING, logger="jobqueue.worker"):
        report = await drain(db_url, registry=registry(), retry_policy=_no_wait())
    assert report["failed"] == 1 and report["retried"] == 1
    entries = await history(conn, job_id)
    assert [e["attempt"] for e in entries] == [1, 2]
    for entry in entries:
        assert entry["error"] == "KeyError: 'width'"
        trace = entry["traceback"]
        assert trace.startswith("Traceback (most recent call last):")
        assert 'return int(options["width"])' in trace and "in _width" in trace
        assert trace.rstrip().endswith("KeyError: 'width'")
    logged = [r for r in caplog.records if getattr(r, "event", None) == "job_failed"
              and getattr(r, "job_id", None) == str(job_id)]
    assert len(logged) == 2  # once per attempt
    for record in logged:
        assert record.levelno == logging.WARNING and "in _width" in record.traceback
        text = formatter("text").format(record)  # what `jobqueue worker` prints
        assert text.splitlines()[0].endswith("KeyError: 'width'")
        assert '  File "' in text and "in _width" in text
        assert "in _width" in json.loads(formatter("json").format(record))["traceback"]


async def test_the_traceback_is_shown_by_status_the_api_and_the_job_page(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection,
        make_client: Callable[..., httpx.AsyncClient]) -> None:
    async with engine.begin() as s:
        job_id = await enqueue(s, "resize", {}, max_retries=0)
    await drain(db_url, registry=registry())
    assert len(await history(conn, job_id)) == 1  # something to show

    detail = await job_detail(conn, job_id)
    assert detail is not None
    shown = format_job(detail)  # what `jobqueue status ID` prints
    assert "attempt 1 failed at" in shown and "KeyError: 'width'" in shown
    assert '  File "' in shown and "in _width" in shown

    async with make_client(token=None) as web:
        api = (await web.get(f"/jobs/{job_id}")).json()
        assert "in _width" in api["error_history"][0]["traceback"]
        page = (await web.get(f"/dashboard/jobs/{job_id}")).text
    assert '<details class="traceback">' in page
    assert "return int(options[&#34;width&#34;])" in page  # escaped, as all text is


async def test_a_job_stopped_by_its_timeout_has_a_reason_not_a_traceback(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    """A stop is the worker's doing, not an exception of the handler's: its
    entry says why, with no traceback key."""
    slow = HandlerRegistry()

    @slow.register("nap", timeout=0.05)
    async def nap(session: Any, payload: dict[str, Any]) -> None:
        await asyncio.sleep(5)

    async with engine.begin() as s:
        job_id = await enqueue(s, "nap", {}, max_retries=0)
    await drain(db_url, registry=slow)
    [entry] = await history(conn, job_id)
    assert entry["error"].startswith("TimeoutError: the handler ran longer")
    assert "traceback" not in entry


def test_a_long_traceback_keeps_its_end() -> None:
    """Bounded, losing the outermost part: a long cause's message here."""
    try:
        try:
            raise ValueError("x" * 20_000)
        except ValueError as cause:
            raise KeyError("the end") from cause
    except KeyError as exc:
        trace = traceback_text(exc)
    assert len(trace) == TRACEBACK_MAX_LENGTH
    assert trace.startswith("[… the traceback's beginning is cut]")
    assert "direct cause" in trace and trace.rstrip().endswith("KeyError: 'the end'")


def _no_wait() -> RetryPolicy:
    return RetryPolicy(base=0.0, factor=1.0, cap=0.0, jitter=0.0)
