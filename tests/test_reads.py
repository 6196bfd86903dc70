"""Operators' reads that cannot weigh on the queue (issue 31, item 5): a
statement timeout on every read of the API and the dashboard, `GET /jobs`
pages that look at a bounded number of jobs, readings shared by clients."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import asyncpg
import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from jobqueue import db
from jobqueue.api import create_router
from jobqueue.ops import api
from jobqueue.ops.reads import Shared
from tests.conftest import client_for


async def test_a_read_past_its_statement_timeout_is_a_503_that_says_so(
        make_client: Callable[..., httpx.AsyncClient], conn: asyncpg.Connection,
        db_url: str) -> None:
    """A lock holds every read of `jobs` back: without a timeout each
    request would wait for as long as the lock lasts."""
    job_id = await conn.fetchval("INSERT INTO jobs (job_type) VALUES ('t') RETURNING id")
    blocker = await asyncpg.connect(**db.asyncpg_connect_args(db_url))
    try:
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
        async with make_client(read_timeout=0.3) as web:
            for path in ("/jobs", f"/jobs/{job_id}", "/queues", "/metrics"):
                answer = await asyncio.wait_for(web.get(path), 20)
                assert answer.status_code == 503, (path, answer.text)
                assert "statement timeout (0.3 s)" in answer.json()["detail"], path
            for path in ("/", "/dashboard/jobs", f"/dashboard/jobs/{job_id}"):
                page = await asyncio.wait_for(web.get(path), 20)
                assert page.status_code == 503 and "statement timeout" in page.text, path
            await tx.rollback()
            for path in ("/jobs", f"/jobs/{job_id}", "/queues", "/metrics", "/"):
                assert (await web.get(path)).status_code == 200, path
    finally:
        await blocker.close()


async def test_the_timeout_stays_in_the_reads_transaction(engine: AsyncEngine) -> None:
    """The router on an engine of the caller's own: its connections go back
    to that pool with the caller's settings, not the API's timeout."""
    app = FastAPI()
    app.include_router(create_router(engine, token=None, read_timeout=0.25))
    async with client_for(app) as web:
        assert (await web.get("/jobs")).status_code == 200
    async with engine.connect() as c:
        assert (await c.execute(text("SHOW statement_timeout"))).scalar() == "0"


async def test_a_page_looks_at_a_bounded_number_of_jobs_and_the_walk_finds_every_match(
        client: httpx.AsyncClient, conn: asyncpg.Connection,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A filter that matches few: each page looks at `PAGE_SCAN` jobs at
    most, so it can come back short (even empty) with a `next`; walking to
    the end finds each match once, newest first."""
    monkeypatch.setattr(api, "PAGE_SCAN", 100)
    await conn.execute("""
        INSERT INTO jobs (job_type, payload)
        SELECT CASE WHEN g IN (5, 250, 990) THEN 'rare' ELSE 'common' END,
               jsonb_build_object('n', g)
        FROM generate_series(1, 1000) AS g""")
    rare = [r["id"] for r in await conn.fetch(
        "SELECT id FROM jobs WHERE job_type = 'rare' ORDER BY id DESC")]
    assert len(rare) == 3
    found: list[uuid.UUID] = []
    pages, params = 0, {"job_type": "rare", "limit": "2"}
    while True:
        page = (await client.get("/jobs", params=params)).json()
        pages += 1
        found += [uuid.UUID(j["id"]) for j in page["jobs"]]
        assert len(page["jobs"]) <= 2
        if page["next"] is None:
            break
        params = {**params, "before": page["next"]}
        assert pages < 50
    assert found == rare
    assert 10 <= pages <= 12  # 1,000 jobs at 100 a look, and no more
    # Without a filter a page is full until the end, as before.
    first = (await client.get("/jobs", params={"limit": "500"})).json()
    assert len(first["jobs"]) == 500 and first["next"] is not None


async def test_a_cursor_of_the_earlier_form_still_pages(client: httpx.AsyncClient,
                                                       conn: asyncpg.Connection) -> None:
    import base64

    await conn.execute("INSERT INTO jobs (job_type) SELECT 't' FROM generate_series(1, 5)")
    ids = [r["id"] for r in await conn.fetch("SELECT id FROM jobs ORDER BY id DESC")]
    old = base64.urlsafe_b64encode(
        f"2026-12-01T00:00:00+00:00|{ids[1]}".encode()).decode().rstrip("=")
    page = (await client.get("/jobs", params={"before": old})).json()
    assert [uuid.UUID(j["id"]) for j in page["jobs"]] == ids[2:]


async def test_one_reading_serves_every_caller_within_its_ttl() -> None:
    reads: list[float] = []

    async def read(conn: Any) -> int:
        reads.append(asyncio.get_running_loop().time())
        await asyncio.sleep(0.05)  # a slow pass over the table
        return len(reads)

    shared: Shared[int] = Shared(read, ttl=0.3)
    assert await asyncio.gather(*[shared.get(None) for _ in range(8)]) == [1] * 8
    assert await shared.get(None) == 1  # still fresh
    shared.forget()  # a change made through the API
    assert await shared.get(None) == 2
    await asyncio.sleep(0.35)
    assert await shared.get(None) == 3
