"""The HTTP API, driven with httpx against the real database."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from jobqueue import HandlerRegistry, RetryPolicy, api, enqueue_many
from jobqueue.api import TOKEN_ENV, create_app, create_router
from jobqueue.ops.cli import build_parser
from jobqueue.ops.throttle import Throttle
from jobqueue.schema.queries import queries
from jobqueue.testing import drain, wait_for
from tests.conftest import ROOT, client_for, wait_answering

TOKEN = "s3cret-token-for-tests"


@pytest.fixture
async def client(make_client: Callable[..., httpx.AsyncClient]
                 ) -> AsyncIterator[httpx.AsyncClient]:
    async with make_client() as c:
        yield c


async def post_job(client: httpx.AsyncClient, **body: Any) -> uuid.UUID:
    response = await client.post("/jobs", json={"job_type": "t", **body})
    assert response.status_code == 201, response.text
    return uuid.UUID(response.json()["id"])


def always_failing() -> HandlerRegistry:
    registry = HandlerRegistry()

    @registry.register("t")
    async def fail(session: AsyncSession, payload: dict[str, Any]) -> None:
        raise RuntimeError("boom")

    return registry


def succeeding() -> HandlerRegistry:
    registry = HandlerRegistry()

    @registry.register("t")
    async def ok(session: AsyncSession, payload: dict[str, Any]) -> dict[str, Any]:
        return {"echo": payload}

    return registry


# -- enqueue and read ---------------------------------------------------------------


async def test_enqueue_then_read_the_job(client: httpx.AsyncClient, conn: asyncpg.Connection
                                         ) -> None:
    response = await client.post("/jobs", json={
        "job_type": "send_email", "payload": {"to": "a@x", "n": [1, 2.5, None]},
        "max_retries": 5, "run_at": "2031-05-01T10:00:00+02:00"})
    assert response.status_code == 201, response.text
    job_id = uuid.UUID(response.json()["id"])
    assert response.headers["location"] == f"http://localhost/jobs/{job_id}"

    row = await conn.fetchrow("SELECT * FROM jobs WHERE id = $1", job_id)
    assert row["job_type"] == "send_email" and row["max_retries"] == 5
    assert json.loads(row["payload"]) == {"to": "a@x", "n": [1, 2.5, None]}
    assert row["run_at"].isoformat() == "2031-05-01T08:00:00+00:00"

    job = (await client.get(f"/jobs/{job_id}")).json()
    assert job["id"] == str(job_id) and job["status"] == "pending"
    assert job["attempts"] == 0 and job["retry_count"] == 0 and job["error_history"] == []
    assert job["payload"] == {"to": "a@x", "n": [1, 2.5, None]} and job["result"] is None
    assert datetime.fromisoformat(job["run_at"]) == row["run_at"]
    assert datetime.fromisoformat(job["created_at"]) == row["created_at"]
    assert job["started_at"] is None and job["completed_at"] is None


async def test_a_timeout_is_kept_and_shown(client: httpx.AsyncClient,
                                          conn: asyncpg.Connection) -> None:
    timed, plain = await post_job(client, timeout=2.5), await post_job(client)
    assert await conn.fetchval("SELECT timeout FROM jobs WHERE id = $1", timed) == 2.5
    assert (await client.get(f"/jobs/{timed}")).json()["timeout"] == 2.5
    assert (await client.get(f"/jobs/{plain}")).json()["timeout"] is None
    listed = {j["id"]: j["timeout"] for j in (await client.get("/jobs")).json()["jobs"]}
    assert listed == {str(timed): 2.5, str(plain): None}


async def test_defaults_and_a_finished_job(client: httpx.AsyncClient, db_url: str) -> None:
    job_id = await post_job(client)
    await drain(db_url, registry=succeeding())
    job = (await client.get(f"/jobs/{job_id}")).json()
    assert job["status"] == "completed" and job["attempts"] == 1
    assert job["max_retries"] == 3 and job["payload"] == {} and job["result"] == {"echo": {}}
    started, completed = (datetime.fromisoformat(job[k]) for k in ("started_at", "completed_at"))
    assert datetime.fromisoformat(job["created_at"]) <= started <= completed


BIG = "x" * 1_000_001


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"job_type": "t", "payload": [1, 2]}, "must be a JSON object"),
        ({"job_type": "t", "payload": "text"}, "must be a JSON object"),
        ({"job_type": "t", "payload": {"a": "nul \u0000 here"}}, "NUL"),
        ({"job_type": "t", "payload": {"k\u0000": 1}}, "NUL"),
        ({"job_type": "t", "payload": {"a": "\ud800"}}, "surrogate"),
        ({"job_type": "t", "payload": {"big": BIG}}, "the limit is 1,000,000"),
        ({"job_type": "x" * 101}, "limit is 100"),
        ({"job_type": ""}, "must not be empty"),
        ({"job_type": 7}, "must be a string"),
        ({"job_type": "a\u0000b"}, "NUL"),
        ({"job_type": "\udcff"}, "surrogate"),
        ({"payload": {}}, "Field required"),
        ({"job_type": "t", "max_retries": -1}, "between 0 and 1000"),
        ({"job_type": "t", "max_retries": 1001}, "between 0 and 1000"),
        ({"job_type": "t", "max_retries": "3"}, "whole number"),
        ({"job_type": "t", "max_retries": True}, "whole number"),
        ({"job_type": "t", "max_retries": 2.5}, "whole number"),
        ({"job_type": "t", "run_at": "next tuesday"}, "ISO 8601"),
        ({"job_type": "t", "run_at": "2030-01-01T00:00:00"}, "time zone"),
        ({"job_type": "t", "run_at": 1700000000}, "ISO 8601"),
        ({"job_type": "t", "run_at": "0001-01-01T00:00:00+14:00"}, "out of range"),
        ({"job_type": "t", "prio": 1}, "Extra inputs"),
        ({"job_type": "t", "queue": "no spaces"}, "not a valid name"),
        ({"job_type": "t", "queue": "x" * 65}, "not a valid name"),
        ({"job_type": "t", "queue": 7}, "must be a string"),
        ({"job_type": "t", "queue": None}, "must be a string"),
        ({"job_type": "t", "priority": 1001}, "between -1000 and 1000"),
        ({"job_type": "t", "priority": "3"}, "whole number"),
        ({"job_type": "t", "priority": 2.5}, "whole number"),
        ({"job_type": "t", "unique_key": ""}, "must not be empty"),
        ({"job_type": "t", "unique_key": "k" * 256}, "limit is 255"),
        ({"job_type": "t", "unique_key": 42}, "must be a string"),
        ({"job_type": "t", "unique_key": "a\u0000"}, "NUL"),
        ({"job_type": "t", "unique_key": "\ud800"}, "surrogate"),
        ({"job_type": "t", "timeout": 0}, "more than 0 and at most 31,536,000"),
        ({"job_type": "t", "timeout": -3}, "more than 0"),
        ({"job_type": "t", "timeout": 31_536_001}, "at most 31,536,000"),
        ({"job_type": "t", "timeout": "30"}, "number of seconds"),
        ({"job_type": "t", "timeout": True}, "number of seconds"),
    ],
)
async def test_bad_input_is_a_422_with_a_message(
    client: httpx.AsyncClient, conn: asyncpg.Connection, body: dict[str, Any], message: str
) -> None:
    # json.dumps escapes lone surrogates (\\ud800), as any JSON client may send them.
    response = await client.post("/jobs", content=json.dumps(body),
                                 headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert message in response.text
    assert len(response.content) < 2000  # the input is not echoed back
    assert await conn.fetchval("SELECT count(*) FROM jobs") == 0


@pytest.mark.parametrize(
    ("content", "status", "message"),
    [
        (b'{"job_type": "t", ', 422, "JSON decode error"),
        (b'{"job_type": "t", "payload": {"n": 1e400}}', 422, "not valid JSON"),  # inf
        (b'{"job_type": "t", "payload": {"n": ' + b"9" * 5000 + b"}}", 400, "parsing the body"),
        (b'{"job_type": "t", "payload": ' + b"[" * 600 + b"]" * 600 + b"}", 422, "JSON object"),
        (b'{"job_type": "t", "payload": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", 400,
         "parsing the body"),
        (b'["t"]', 422, "valid dictionary"),
        (b'{"job_type": "t", "timeout": NaN}', 422, "more than 0"),
        (b'{"job_type": "t", "timeout": Infinity}', 422, "more than 0"),
    ],
)
async def test_bodies_python_or_postgresql_cannot_take_are_4xx(
    client: httpx.AsyncClient, conn: asyncpg.Connection, content: bytes, status: int,
    message: str
) -> None:
    response = await client.post("/jobs", content=content,
                                 headers={"content-type": "application/json"})
    assert response.status_code == status, response.text[:500]
    assert message in response.text
    assert await conn.fetchval("SELECT count(*) FROM jobs") == 0


async def test_deeply_nested_payload_that_fits_is_stored_and_read_back(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    # Deeper than pydantic serializes (255 levels), not as deep as Python parses.
    body = '{"job_type": "t", "payload": ' + '{"a": ' * 900 + "1" + "}" * 900 + "}"
    response = await client.post("/jobs", content=body,
                                 headers={"content-type": "application/json"})
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    assert await conn.fetchval("SELECT payload #>> $1 FROM jobs", ["a"] * 900) == "1"
    response = await client.get(f"/jobs/{job_id}")
    assert response.status_code == 200
    assert response.text.count('{"a": ') == 900 and response.json()["id"] == job_id


async def test_malformed_and_unknown_ids(client: httpx.AsyncClient) -> None:
    unknown = uuid.uuid4()
    for method, path in [("GET", "/jobs/{}"), ("POST", "/jobs/{}/retry"),
                         ("DELETE", "/jobs/{}")]:
        bad = await client.request(method, path.format("not-a-uuid"))
        assert bad.status_code == 422 and "UUID" in bad.text, (method, bad.text)
        missing = await client.request(method, path.format(unknown))
        assert missing.status_code == 404, (method, missing.text)
        assert missing.json() == {"detail": f"no job {unknown}"}


# -- listing --------------------------------------------------------------------------


async def test_pages_hold_every_job_once_newest_first(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    async with engine.begin() as c:
        ids = await enqueue_many(c, "t", [{"n": n} for n in range(23)])
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 5, **({"before": cursor} if cursor else {})}
        page = (await client.get("/jobs", params=params)).json()
        seen += [j["id"] for j in page["jobs"]]
        assert len(page["jobs"]) <= 5 and "payload" not in page["jobs"][0]
        if len(seen) == 5:
            await post_job(client)  # a job enqueued while paging shifts nothing
        cursor = page["next"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(map(str, ids)) and len(seen) == len(set(seen)) == 23
    assert seen == [str(i) for i in reversed(ids)]  # created_at order: newest first


async def test_list_filters_by_status_and_type(
    client: httpx.AsyncClient, db_url: str
) -> None:
    done = await post_job(client)
    await drain(db_url, registry=succeeding())
    waiting = await post_job(client)
    other = await post_job(client, job_type="other")

    async def ids(**params: Any) -> set[str]:
        response = await client.get("/jobs", params=params)
        assert response.status_code == 200, response.text
        return {j["id"] for j in response.json()["jobs"]}

    assert await ids(status="completed") == {str(done)}
    assert await ids(status="pending") == {str(waiting), str(other)}
    assert await ids(status="pending", job_type="other") == {str(other)}
    assert await ids(job_type="t") == {str(done), str(waiting)}
    assert await ids(job_type="none") == set()
    page = (await client.get("/jobs", params={"status": "completed"})).json()
    assert page["jobs"][0]["attempts"] == 1 and page["next"] is None


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"status": "done"}, "'pending'"),
        ({"limit": 0}, "greater than or equal to 1"),
        ({"limit": 501}, "less than or equal to 500"),
        ({"limit": "many"}, "valid integer"),
        ({"before": "garbage"}, "not a cursor"),
        ({"before": "MjAzMC0wMS0wMVQwMDowMDowMHxub3BlCg"}, "not a cursor"),
        ({"job_type": "x" * 101}, "limit is 100"),
        ({"job_type": "a\u0000"}, "NUL"),
    ],
)
async def test_bad_list_parameters_are_422(client: httpx.AsyncClient,
                                           params: dict[str, Any], message: str) -> None:
    response = await client.get("/jobs", params=params)
    assert response.status_code == 422, response.text
    assert message in response.text


# -- retry and cancel ----------------------------------------------------------------


async def test_retry_a_failed_job(client: httpx.AsyncClient, db_url: str,
                                  conn: asyncpg.Connection) -> None:
    job_id = await post_job(client, max_retries=1)
    await drain(db_url, registry=always_failing(), retry_policy=RetryPolicy(base=0, jitter=0))
    failed = (await client.get(f"/jobs/{job_id}")).json()
    assert failed["status"] == "failed" and failed["attempts"] == 2

    woken = asyncio.Event()
    await conn.add_listener("jobqueue", lambda *_: woken.set())
    response = await client.post(f"/jobs/{job_id}/retry")
    assert response.status_code == 200, response.text
    job = response.json()
    assert job["status"] == "pending" and job["retry_count"] == 0
    assert job["completed_at"] is None and job["next_retry_at"] is None
    assert [e["attempt"] for e in job["error_history"]] == [1, 2]  # history kept
    assert job["error_message"] == "RuntimeError: boom"
    await asyncio.wait_for(woken.wait(), 5)  # idle workers hear of it

    await drain(db_url, registry=succeeding())
    job = (await client.get(f"/jobs/{job_id}")).json()
    assert job["status"] == "completed" and job["attempts"] == 3

    again = await client.post(f"/jobs/{job_id}/retry")
    assert again.status_code == 409
    assert again.json()["detail"] == (f"job {job_id} is completed; "
                                      "only failed jobs can be retried")
    pending = await post_job(client)
    conflict = await client.post(f"/jobs/{pending}/retry")
    assert conflict.status_code == 409 and "is pending" in conflict.text
    assert await conn.fetchval("SELECT status FROM jobs WHERE id = $1", pending) == "pending"


async def test_cancel_a_job_that_has_not_started(client: httpx.AsyncClient, db_url: str,
                                                 conn: asyncpg.Connection) -> None:
    plain = await post_job(client)
    reasoned = await post_job(client)
    response = await client.delete(f"/jobs/{plain}")
    assert response.status_code == 200, response.text
    job = response.json()
    assert job["status"] == "failed" and job["error_message"] == "cancelled"
    assert job["error_history"] == [] and job["attempts"] == 0
    assert job["completed_at"] is not None and job["started_at"] is None
    response = await client.delete(f"/jobs/{reasoned}", params={"reason": "customer left"})
    assert response.json()["error_message"] == "cancelled: customer left"

    report = await drain(db_url, registry=succeeding())  # nothing left to run
    assert report["processed"] == 0 and report["failed"] == 0
    again = await client.delete(f"/jobs/{plain}")
    assert again.status_code == 409 and again.json()["detail"] == (
        f"job {plain} is failed; it has finished, so there is nothing to cancel")
    assert (await client.delete(f"/jobs/{uuid.uuid4()}")).status_code == 404

    # A cancelled job is a failed one: it can be run again.
    assert (await client.post(f"/jobs/{plain}/retry")).json()["status"] == "pending"


async def test_cancel_a_retrying_job(client: httpx.AsyncClient, db_url: str) -> None:
    job_id = await post_job(client, max_retries=3)
    await drain(db_url, registry=always_failing(),
                retry_policy=RetryPolicy(base=3600, jitter=0))  # next retry in an hour
    assert (await client.get(f"/jobs/{job_id}")).json()["status"] == "retrying"
    job = (await client.delete(f"/jobs/{job_id}")).json()
    assert job["status"] == "failed" and job["next_retry_at"] is None
    assert len(job["error_history"]) == 1  # the real attempt, and nothing for the cancel


async def claim(conn: asyncpg.Connection, job_id: uuid.UUID) -> None:
    """Play a worker that has claimed the job (it shows `processing`)."""
    claimed = await queries["claim"].fetch(conn, limit=1, worker_id=42, queue="default",
                                           arm_types=["t"], priorities=[0], floors=[None],
                                              floor_ids=[None])
    assert [r["id"] for r in claimed] == [job_id]


async def test_cancel_a_running_job_asks_its_worker_and_says_it_is_still_running(
        make_client: Callable[..., httpx.AsyncClient], conn: asyncpg.Connection) -> None:
    async with make_client(cancel_wait=0.3) as client:
        job_id = await post_job(client)
        await claim(conn, job_id)
        asked = asyncio.Queue[str]()
        await conn.add_listener("jobqueue", lambda _c, _p, _ch, payload: asked.put_nowait(payload))
        response = await client.delete(f"/jobs/{job_id}", params={"reason": "too slow"})
        assert response.status_code == 202, response.text
        job = response.json()
        assert job["cancelling"] is True and job["status"] == "processing"
        assert job["error_message"] is None  # the job is its worker's to end
        assert await asyncio.wait_for(asked.get(), 5) == f"cancel:{job_id}"


async def test_cancel_a_running_job_that_its_worker_stops(
        make_client: Callable[..., httpx.AsyncClient], conn: asyncpg.Connection) -> None:
    """The test plays the worker: when it hears the request, it records the
    job failed `cancelled` with `fail`, as the worker does; the API, waiting,
    answers 200 with the job as it ended."""
    async with make_client(cancel_wait=30) as client:
        job_id = await post_job(client)
        await claim(conn, job_id)
        asked = asyncio.Queue[str]()
        await conn.add_listener("jobqueue", lambda _c, _p, _ch, payload: asked.put_nowait(payload))
        deleting = asyncio.create_task(client.delete(f"/jobs/{job_id}"))
        assert await asyncio.wait_for(asked.get(), 10) == f"cancel:{job_id}"
        await queries["fail"].fetch(conn, ids=[job_id], errors=["cancelled"], delays=[0.0],
                                    retry=[False], traces=[None], worker_id=42, taken=False)
        response = await asyncio.wait_for(deleting, 10)
        assert response.status_code == 200, response.text
        job = response.json()
        assert job["status"] == "failed" and job["error_message"] == "cancelled"
        assert "cancelling" not in job


@pytest.mark.parametrize(("reason", "message"),
                         [("a\u0000b", "NUL"), ("x" * 2000, "at most 1989 characters")])
async def test_bad_cancel_reasons_are_422(client: httpx.AsyncClient, conn: asyncpg.Connection,
                                          reason: str, message: str) -> None:
    job_id = await post_job(client)
    response = await client.delete(f"/jobs/{job_id}", params={"reason": reason})
    assert response.status_code == 422 and message in response.text
    assert await conn.fetchval("SELECT status FROM jobs WHERE id = $1", job_id) == "pending"


# -- routing: queues, priorities, unique keys, pause and limits ------------------------------


async def test_enqueue_into_a_queue_with_priority_and_a_unique_key(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    body = {"job_type": "t", "queue": "emails", "priority": 7, "unique_key": "welcome:42"}
    first = await client.post("/jobs", json=body)
    assert first.status_code == 201, first.text
    job_id = first.json()["id"]
    assert first.json() == {"id": job_id, "existed": False}

    again = await client.post("/jobs", json={**body, "payload": {"other": True}})
    assert again.status_code == 200, again.text
    assert again.json() == {"id": job_id, "existed": True}
    assert again.headers["location"] == f"http://localhost/jobs/{job_id}"
    assert await conn.fetchval("SELECT count(*) FROM jobs") == 1

    job = (await client.get(f"/jobs/{job_id}")).json()
    assert (job["queue"], job["priority"], job["unique_key"], job["payload"]) == (
        "emails", 7, "welcome:42", {})
    plain = (await client.get(f"/jobs/{await post_job(client)}")).json()
    assert (plain["queue"], plain["priority"], plain["unique_key"]) == ("default", 0, None)


async def test_list_filters_by_queue_and_shows_queue_and_priority(
    client: httpx.AsyncClient
) -> None:
    mail = await post_job(client, queue="mail", priority=3)
    await post_job(client)
    page = (await client.get("/jobs", params={"queue": "mail"})).json()
    assert [(j["id"], j["queue"], j["priority"]) for j in page["jobs"]] == [
        (str(mail), "mail", 3)]
    assert len((await client.get("/jobs")).json()["jobs"]) == 2
    bad = await client.get("/jobs", params={"queue": "no spaces"})
    assert bad.status_code == 422 and "not a valid name" in bad.text


async def test_queues_pause_resume_and_limits(client: httpx.AsyncClient,
                                              conn: asyncpg.Connection) -> None:
    assert (await client.get("/queues")).json() == {"queues": [], "unserved": [], "estimated": []}
    await post_job(client, queue="mail")
    await post_job(client, queue="mail", run_at="2031-01-01T00:00:00+00:00")

    paused = await client.post("/queues/mail/pause")
    assert paused.status_code == 200, paused.text
    assert paused.json() == {"queue": "mail", "paused": True, "concurrency": None, "rate": None}
    limited = await client.put("/queues/mail/limits", json={"concurrency": 4, "rate": "20/s"})
    assert limited.json() == {"queue": "mail", "paused": True, "concurrency": 4, "rate": "20/s"}
    kept = await client.put("/queues/mail/limits", json={"rate": None})  # concurrency kept
    assert kept.json() == {"queue": "mail", "paused": True, "concurrency": 4, "rate": None}
    per_hour = await client.put("/queues/api/limits", json={"rate": "1000/h"})
    assert per_hour.json()["rate"] == "1000/h"

    listed = (await client.get("/queues")).json()
    assert [q["queue"] for q in listed["queues"]] == ["api", "mail"]
    mail = listed["queues"][1]
    assert mail["counts"] == {"pending": 2, "processing": 0, "completed": 0, "failed": 0,
                              "retrying": 0}
    assert (mail["running"], mail["paused"], mail["concurrency"], mail["rate"]) == (
        0, True, 4, None)
    assert mail["oldest_due_age_seconds"] >= 0
    assert listed["queues"][0]["oldest_due_age_seconds"] is None
    assert [(u["queue"], u["job_type"], u["count"]) for u in listed["unserved"]] == [
        ("mail", "t", 1)]  # no worker at all; the job due in 2031 is not waiting yet

    resumed = await client.post("/queues/mail/resume")
    assert resumed.json() == {"queue": "mail", "paused": False, "concurrency": 4, "rate": None}
    await client.put("/queues/mail/limits", json={"concurrency": None})
    assert await conn.fetchval("SELECT array_agg(name) FROM jobqueue_queues") == ["api"]


@pytest.mark.parametrize(("method", "path", "body", "message"), [
    ("POST", "/queues/no%20spaces/pause", None, "not a valid name"),
    ("POST", "/queues/" + "x" * 65 + "/resume", None, "not a valid name"),
    ("PUT", "/queues/no%20spaces/limits", {"concurrency": 2}, "not a valid name"),
    ("PUT", "/queues/mail/limits", {}, "give concurrency, rate or both"),
    ("PUT", "/queues/mail/limits", {"concurrency": 0}, "between 1 and"),
    ("PUT", "/queues/mail/limits", {"concurrency": "2"}, "whole number"),
    ("PUT", "/queues/mail/limits", {"concurrency": True}, "whole number"),
    ("PUT", "/queues/mail/limits", {"rate": "fast"}, "must look like 20/s"),
    ("PUT", "/queues/mail/limits", {"rate": 20}, "must look like 20/s"),
    ("PUT", "/queues/mail/limits", {"rate": "0/s"}, "1 to"),
    ("PUT", "/queues/mail/limits", {"concurrency": 2, "paused": True}, "Extra inputs"),
])
async def test_bad_queue_names_and_limits_are_422(
    client: httpx.AsyncClient, conn: asyncpg.Connection, method: str, path: str,
    body: dict[str, Any] | None, message: str
) -> None:
    response = await client.request(method, path, json=body)
    assert response.status_code == 422, response.text
    assert message in response.text
    assert await conn.fetchval("SELECT count(*) FROM jobqueue_queues") == 0


async def test_retry_of_a_job_whose_unique_key_is_taken_again_is_409(
    client: httpx.AsyncClient, db_url: str, conn: asyncpg.Connection
) -> None:
    failed = await post_job(client, unique_key="invoice:7", max_retries=0)
    await drain(db_url, registry=always_failing())
    assert await conn.fetchval("SELECT status FROM jobs WHERE id = $1", failed) == "failed"
    holder = await post_job(client, unique_key="invoice:7")  # the key is free: a new job
    assert holder != failed

    refused = await client.post(f"/jobs/{failed}/retry")
    assert refused.status_code == 409, refused.text
    assert refused.json() == {"detail": f"job {failed} cannot run again while unfinished job "
                                        f"{holder} holds its unique key 'invoice:7'"}
    rows = dict(await conn.fetch("SELECT id, status FROM jobs"))
    assert rows == {failed: "failed", holder: "pending"}  # nothing changed

    await drain(db_url, registry=succeeding())  # the holder finishes: the key is free
    retried = await client.post(f"/jobs/{failed}/retry")
    assert retried.status_code == 200 and retried.json()["status"] == "pending"


# -- guards: body size, token ------------------------------------------------------------


async def test_bodies_over_the_limit_are_413_before_parsing(
    make_client: Callable[..., httpx.AsyncClient], conn: asyncpg.Connection
) -> None:
    async with make_client(max_body_bytes=1000) as client:
        body = json.dumps({"job_type": "t", "payload": {"s": "x" * 1000}}).encode()
        response = await client.post("/jobs", content=body,
                                     headers={"content-type": "application/json"})
        assert response.status_code == 413
        assert response.json() == {"detail": "request body is larger than the limit of "
                                              "1,000 bytes"}

        async def chunks() -> AsyncIterator[bytes]:  # streamed: no Content-Length
            yield b'{"job_type": "t", "payload": {"s": "'
            for _ in range(10):
                yield b"x" * 200
            yield b'"}}'

        streamed = await client.post("/jobs", content=chunks(),
                                     headers={"content-type": "application/json"})
        assert "content-length" not in streamed.request.headers
        assert streamed.status_code == 413

        # A lying Content-Length is refused before anything is read.
        lying = await client.post("/jobs", content=b"{}", headers={
            "content-type": "application/json", "content-length": "5000"})
        assert lying.status_code == 413

        ok = await client.post("/jobs", json={"job_type": "t", "payload": {"s": "x" * 900}})
        assert ok.status_code == 201
    assert await conn.fetchval("SELECT count(*) FROM jobs") == 1


async def test_default_limit_is_one_mebibyte(client: httpx.AsyncClient) -> None:
    body = b'{"job_type": "t", "payload": {"s": "' + b"x" * (1024 * 1024) + b'"}}'
    response = await client.post("/jobs", content=body,
                                 headers={"content-type": "application/json"})
    assert response.status_code == 413 and "1,048,576 bytes" in response.text


async def test_token_guards_every_route(make_client: Callable[..., httpx.AsyncClient],
                                        monkeypatch: pytest.MonkeyPatch,
                                        conn: asyncpg.Connection) -> None:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    # 36 wrong tokens in a moment: more than the default throttle lets by.
    async with make_client(throttle=Throttle(failures=100)) as client:
        routes = [("GET", "/jobs"), ("GET", f"/jobs/{uuid.uuid4()}"), ("POST", "/jobs"),
                  ("POST", f"/jobs/{uuid.uuid4()}/retry"), ("DELETE", f"/jobs/{uuid.uuid4()}"),
                  ("GET", "/metrics"), ("GET", "/openapi.json"),
                  ("GET", "/queues"), ("POST", "/queues/q/pause"), ("POST", "/queues/q/resume"),
                  ("PUT", "/queues/q/limits")]
        for headers in ({}, {"Authorization": "Bearer wrong"},
                        {"Authorization": f"Basic {TOKEN}"}, {"Authorization": TOKEN}):
            for method, path in routes:
                response = await client.request(method, path, headers=headers,
                                                json={"job_type": "t"})
                assert response.status_code == 401, (method, path, headers, response.text)
                assert response.headers["www-authenticate"] == "Bearer"
                assert response.headers["x-content-type-options"] == "nosniff"
        # The token is checked before the body is even read.
        huge = await client.post("/jobs", content=b"x" * (2 * 1024 * 1024))
        assert huge.status_code == 401
        assert await conn.fetchval("SELECT count(*) FROM jobs") == 0
        assert await conn.fetchval("SELECT count(*) FROM jobqueue_queues") == 0

        auth = {"Authorization": f"Bearer {TOKEN}"}
        created = await client.post("/jobs", json={"job_type": "t"}, headers=auth)
        assert created.status_code == 201
        for path in ("/jobs", f"/jobs/{created.json()['id']}", "/metrics", "/openapi.json"):
            answer = await client.get(path, headers=auth)
            assert answer.status_code == 200, path
            assert answer.headers["x-content-type-options"] == "nosniff", path


async def test_wrong_tokens_are_throttled_per_client(
        make_client: Callable[..., httpx.AsyncClient], conn: asyncpg.Connection) -> None:
    """Issue 31, item 8: 523 wrong tries a second were answered. After 10
    wrong tokens in a minute, every try is a 429, the right token too (a
    right guess must tell nothing); the dashboard's login counts with them."""
    async with make_client(token=TOKEN) as client:
        for _ in range(5):  # no token at all is no guess
            assert (await client.get("/jobs")).status_code == 401
        for i in range(10):
            wrong = {"Authorization": f"Bearer guess-{i}"}
            assert (await client.get("/jobs", headers=wrong)).status_code == 401
        auth = {"Authorization": f"Bearer {TOKEN}"}
        refused = await client.post("/jobs", json={"job_type": "t"}, headers=auth)
        assert refused.status_code == 429, refused.text
        assert 0 < int(refused.headers["retry-after"]) <= 60
        assert "too many wrong tokens" in refused.json()["detail"]
        login = await client.get("/dashboard/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', login.text).group(1)  # type: ignore[union-attr]
        page = await client.post("/dashboard/login", data={"csrf": csrf, "token": TOKEN})
        assert page.status_code == 429 and "Too many wrong tokens" in page.text
    assert await conn.fetchval("SELECT count(*) FROM jobs") == 0
    async with make_client(token=TOKEN) as client:  # the dashboard's wrong tries count too
        login = await client.get("/dashboard/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', login.text).group(1)  # type: ignore[union-attr]
        for i in range(10):
            page = await client.post("/dashboard/login", data={"csrf": csrf, "token": f"g{i}"})
            assert page.status_code == 401
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert (await client.get("/jobs", headers=auth)).status_code == 429


def test_the_throttle_forgets_a_failure_after_its_window() -> None:
    now = [0.0]
    throttle = Throttle(failures=3, window=60.0, clock=lambda: now[0])
    for t in (0.0, 10.0, 20.0):
        now[0] = t
        assert throttle.wait("a") == 0
        throttle.failed("a")
    assert throttle.wait("a") == 40.0 and throttle.wait("b") == 0  # per client
    now[0] = 60.0  # the first failure has left the window
    assert throttle.wait("a") == 0


@pytest.mark.parametrize("token", ["x", "s" * 15])
def test_a_token_too_short_to_be_a_secret_is_refused(token: str, db_url: str) -> None:
    with pytest.raises(ValueError, match="at least 16"):
        create_app(db_url, token=token)
    with pytest.raises(ValueError, match="at least 16"):
        create_router(token=token)
    env = {**os.environ, "DATABASE_URL": db_url, TOKEN_ENV: token}
    done = subprocess.run([sys.executable, "-m", "jobqueue", "serve", "--port",
                           str(_free_port())], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().count("\n") == 0 and "at least 16" in done.stderr


async def test_no_token_when_the_variable_is_empty(
    make_client: Callable[..., httpx.AsyncClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, "")
    async with make_client() as client:
        assert (await client.get("/jobs")).status_code == 200


# -- the schema, the router in another app, a registry --------------------------------------


async def test_openapi_schema_lists_the_routes(client: httpx.AsyncClient) -> None:
    schema = (await client.get("/openapi.json")).json()
    paths = schema["paths"]
    assert set(paths["/jobs"]) == {"get", "post"}
    assert set(paths["/jobs/{job_id}"]) == {"get", "delete"}
    assert set(paths["/jobs/{job_id}/retry"]) == {"post"}
    assert set(paths["/metrics"]) == {"get"}
    assert set(paths["/queues"]) == {"get"}
    assert set(paths["/queues/{name}/pause"]) == set(paths["/queues/{name}/resume"]) == {"post"}
    assert set(paths["/queues/{name}/limits"]) == {"put"}
    assert "/openapi.json" not in paths and "/docs" not in paths
    assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    new_job = schema["components"]["schemas"]["NewJob"]
    assert set(new_job["properties"]) == {"job_type", "payload", "max_retries", "run_at",
                                          "queue", "priority", "unique_key", "timeout"}
    assert new_job["required"] == ["job_type"]
    # No Swagger page: it loaded its scripts from a CDN, without integrity.
    assert (await client.get("/docs")).status_code == 404


async def test_router_in_an_app_of_your_own(engine: AsyncEngine, conn: asyncpg.Connection
                                            ) -> None:
    app = FastAPI()
    app.include_router(create_router(engine, token=None, max_body_bytes=500), prefix="/queue")
    async with client_for(app) as client:
        response = await client.post("/queue/jobs", json={"job_type": "t", "payload": {"a": 1}})
        assert response.status_code == 201, response.text
        job_id = response.json()["id"]
        assert response.headers["location"] == f"http://localhost/queue/jobs/{job_id}"
        assert (await client.get(f"/queue/jobs/{job_id}")).json()["payload"] == {"a": 1}
        too_big = await client.post("/queue/jobs", json={"job_type": "t", "payload": {
            "s": "x" * 600}})
        assert too_big.status_code == 413  # the guards travel with the router
        assert (await client.get("/queue/metrics")).status_code == 200


async def test_module_router_with_your_own_sessions(engine: AsyncEngine, db_url: str,
                                                    conn: asyncpg.Connection,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)  # read at each request by the module's router
    sessions = async_sessionmaker(engine)

    async def my_session() -> AsyncIterator[AsyncSession]:
        async with sessions() as session:
            yield session

    app = FastAPI()
    app.include_router(api.router)
    app.dependency_overrides[api.get_connection] = my_session
    async with client_for(app) as client:
        assert (await client.post("/jobs", json={"job_type": "t"})).status_code == 401
        auth = {"Authorization": f"Bearer {TOKEN}"}
        response = await client.post("/jobs", json={"job_type": "t"}, headers=auth)
        assert response.status_code == 201, response.text
        job_id = response.json()["id"]
        await drain(db_url, registry=always_failing(), retry_policy=RetryPolicy(base=0, jitter=0))
        retried = await client.post(f"/jobs/{job_id}/retry", headers=auth)
        assert retried.status_code == 200 and retried.json()["status"] == "pending"
        # A running job's cancel waits through a connection to the session's database.
        await claim(conn, uuid.UUID(job_id))
        cancelling = await client.delete(f"/jobs/{job_id}", headers=auth)
        assert cancelling.status_code == 202 and cancelling.json()["cancelling"] is True

    plain = FastAPI()  # the module's router with the engine on app.state
    plain.state.jobqueue_engine = engine
    plain.include_router(api.router)
    async with client_for(plain) as client:
        page = await client.get("/jobs", headers={"Authorization": f"Bearer {TOKEN}"})
        assert [j["id"] for j in page.json()["jobs"]] == [job_id]


async def test_a_registry_refuses_types_it_has_no_handler_for(
    make_client: Callable[..., httpx.AsyncClient], conn: asyncpg.Connection
) -> None:
    async with make_client(registry=succeeding()) as client:
        refused = await client.post("/jobs", json={"job_type": "nobody_handles_this"})
        assert refused.status_code == 422
        assert refused.json()["detail"] == ("no handler is registered for job type "
                                            "'nobody_handles_this'")
        assert (await client.post("/jobs", json={"job_type": "t"})).status_code == 201
    assert await conn.fetchval("SELECT array_agg(job_type) FROM jobs") == ["t"]


async def test_an_unreachable_database_is_503_not_500(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    app = create_app("postgresql://nobody@127.0.0.1:1/none")
    async with client_for(app) as client:
        response = await client.get("/jobs")
        assert response.status_code == 503 and "unavailable" in response.text
        page = await client.get("/")  # the dashboard: a page that says so
        assert page.status_code == 503 and page.headers["content-type"].startswith("text/html")
        assert "The database is unavailable" in page.text
    await app.state.jobqueue_engine.dispose()


# -- jobqueue serve ----------------------------------------------------------------------


def test_serve_binds_loopback_by_default() -> None:
    args = build_parser().parse_args(["serve"])
    assert (args.host, args.port) == ("127.0.0.1", 8000)


@pytest.mark.parametrize("host", ["0.0.0.0", "example.org"])
def test_serve_refuses_a_reachable_address_without_a_token(host: str, db_url: str) -> None:
    """The API and the dashboard can retry, cancel and pause: without a token
    only this machine may reach them. One line, exit 1, nothing listening."""
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    done = subprocess.run([sys.executable, "-m", "jobqueue", "serve", "--host", host,
                           "--port", str(_free_port())], cwd=ROOT,
                          env={**env, "DATABASE_URL": db_url}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0 and TOKEN_ENV in done.stderr
    assert f"refusing to serve on {host}" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.2"])
def test_a_loopback_address_needs_no_token(host: str) -> None:
    from jobqueue.ops.origin import is_loopback

    assert is_loopback(host)
    assert not is_loopback("10.0.0.1") and not is_loopback("db.internal")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _listening_addresses(port: int) -> set[str]:
    """Local addresses with a socket listening on `port` (Linux /proc)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


async def test_jobqueue_serve_answers_on_loopback_and_stops_on_sigterm(
    db_url: str, tmp_path: Path
) -> None:
    port = _free_port()
    env = {**os.environ, "DATABASE_URL": db_url}
    env.pop(TOKEN_ENV, None)
    log = open(tmp_path / "serve.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "jobqueue", "serve", "--port", str(port)],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            async def answers() -> httpx.Response | None:
                assert proc.poll() is None, (tmp_path / "serve.log").read_text()
                try:
                    return await client.get("/jobs")
                except httpx.TransportError:
                    return None

            response = await wait_for(answers, timeout=30, message="jobqueue serve answering")
            assert response.status_code == 200 and response.json() == {"jobs": [], "next": None}
        if os.path.exists("/proc/net/tcp"):
            assert _listening_addresses(port) == {"0100007F"}  # 127.0.0.1 and nothing else
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()
    assert "Traceback" not in (tmp_path / "serve.log").read_text()


async def test_a_database_without_the_schema_is_a_503_that_says_to_migrate(
        server_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`jobqueue serve` started before `jobqueue migrate`: every page and
    route says what to do, instead of a 500 and a traceback in the log."""
    from jobqueue import db

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    url = await db.create_database(server_url, "jobqueue_api_unmigrated", replace=True)
    app = create_app(url, token=None)
    try:
        async with client_for(app) as web:
            for path in ("/jobs", f"/jobs/{uuid.UUID(int=7)}", "/queues"):
                answer = await web.get(path)
                assert answer.status_code == 503, (path, answer.text)
                assert "run `jobqueue migrate`" in answer.json()["detail"], path
            for path in ("/", "/dashboard/jobs"):  # the dashboard's pages
                page = await web.get(path)
                assert page.status_code == 503 and "jobqueue migrate" in page.text, path
    finally:
        await app.state.jobqueue_engine.dispose()
        await db.drop_database(server_url, "jobqueue_api_unmigrated")


@contextlib.asynccontextmanager
async def _served(db_url: str, log_path: Path, *args: str, token: str | None = None,
                  command: tuple[str, ...] = ("jobqueue", "serve")) -> AsyncIterator[str]:
    """`jobqueue serve ARGS` (or `python -m COMMAND ARGS`, run in the log's
    folder) on a free loopback port, answering; its base URL."""
    port = _free_port()
    env = {**os.environ, "DATABASE_URL": db_url}
    env.pop(TOKEN_ENV, None)
    if token is not None:
        env[TOKEN_ENV] = token
    log = open(log_path, "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", *command, "--port", str(port), *args],
                            cwd=ROOT if command[0] == "jobqueue" else log_path.parent,
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        def alive() -> None:
            assert proc.poll() is None, log_path.read_text()
        async with httpx.AsyncClient(base_url=base) as client:
            await wait_answering(client, "/queues", alive)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


async def test_a_rebound_host_name_is_refused_without_a_token(
    db_url: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    """DNS rebinding: a page on rebind.attacker.example, whose name now
    resolves to 127.0.0.1, is same-origin to the browser (Origin and Host
    agree). Only the Host header gives it away: without a token the server
    answers to loopback names only. Nothing is paused, nothing is read."""
    job_id = await conn.fetchval("INSERT INTO jobs (job_type, payload) "
                                 "VALUES ('t', '{\"secret\": 1}') RETURNING id")
    async with _served(db_url, tmp_path / "serve.log") as base:
        port = base.rsplit(":", 1)[1]
        evil = {"host": f"rebind.attacker.example:{port}",
                "origin": f"http://rebind.attacker.example:{port}",
                "sec-fetch-site": "same-origin"}
        async with httpx.AsyncClient(base_url=base) as client:
            for method, path in (("POST", "/queues/default/pause"), ("GET", f"/jobs/{job_id}"),
                                 ("POST", "/jobs"), ("GET", "/"), ("GET", "/metrics")):
                answer = await client.request(method, path, headers=evil,
                                              json={"job_type": "x"} if path == "/jobs" else None)
                assert answer.status_code == 400, (method, path, answer.text)
                assert "rebind" not in answer.text and "secret" not in answer.text
            for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "localhost"):
                assert (await client.get("/queues", headers={"host": host})).status_code == 200
            # The same request from a loopback name goes through: the guard, not the route.
            same = {**evil, "host": f"127.0.0.1:{port}", "origin": f"http://127.0.0.1:{port}"}
            assert (await client.post("/queues/default/pause", headers=same)).status_code == 200
    assert await conn.fetchval("SELECT count(*) FROM jobs") == 1  # POST /jobs wrote nothing
    assert await conn.fetchval("SELECT paused FROM jobqueue_queues WHERE name = 'default'")


#: An app of its own that mounts the routes, as the FastAPI page shows.
MOUNTED_APP = """
import os

from fastapi import FastAPI, HTTPException, Request

from jobqueue import db
from jobqueue.api import create_router

engine = db.create_engine(os.environ["DATABASE_URL"])


def staff(request: Request) -> None:
    if request.headers.get("x-staff-key") != "k" * 20:
        raise HTTPException(401, "staff only")


app = FastAPI()
app.include_router(create_router(engine), prefix="/queue")
app.include_router(create_router(engine, allowed_hosts=["shop.example.org"]), prefix="/named")
app.include_router(create_router(engine, auth=staff), prefix="/staff")
"""


async def test_a_mounted_router_without_a_token_refuses_a_rebound_host_name(
    db_url: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    """Issue 49, finding 3: `create_router(engine)` in an app with no token
    had no Host rule (only `create_app` adds `HostGuard`), so a page whose
    name now resolves to 127.0.0.1 enqueued jobs and paused queues. Its
    routes and its dashboard now answer to loopback names only, as `serve`."""
    job_id = await conn.fetchval("INSERT INTO jobs (job_type, payload) "
                                 "VALUES ('t', '{\"secret\": 1}') RETURNING id")
    (tmp_path / "mounted_app.py").write_text(MOUNTED_APP)
    async with _served(db_url, tmp_path / "uvicorn.log", command=("uvicorn", "mounted_app:app"),
                       ) as base, httpx.AsyncClient(base_url=base) as client:
        port = base.rsplit(":", 1)[1]
        evil = {"host": f"rebind.attacker.example:{port}",
                "origin": f"http://rebind.attacker.example:{port}",
                "sec-fetch-site": "same-origin"}
        for method, path in (("POST", "/queue/queues/default/pause"), ("POST", "/queue/jobs"),
                             ("GET", f"/queue/jobs/{job_id}"), ("GET", "/queue/"),
                             ("GET", "/queue/dashboard/login"), ("GET", "/queue/metrics")):
            answer = await client.request(method, path, headers=evil,
                                          json={"job_type": "x"} if method == "POST" else None)
            assert answer.status_code == 400, (method, path, answer.text)
            assert "loopback names only" in answer.text, answer.text
            assert "rebind" not in answer.text and "secret" not in answer.text
            assert "set-cookie" not in answer.headers
        # The app's own loopback name is served, the same request otherwise.
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):
            same = {**evil, "host": host, "origin": f"http://{host}"}
            created = await client.post("/queue/jobs", json={"job_type": "y"}, headers=same)
            assert created.status_code == 201, created.text
        same = {**evil, "host": f"127.0.0.1:{port}", "origin": f"http://127.0.0.1:{port}"}
        assert (await client.post("/queue/queues/default/pause", headers=same)
                ).status_code == 200
        assert (await client.get("/queue/", headers=same)).status_code == 200
    assert await conn.fetchval("SELECT array_agg(job_type ORDER BY job_type) FROM jobs") \
        == ["t", "y", "y", "y"]  # the rebound POST wrote nothing
    assert await conn.fetchval("SELECT paused FROM jobqueue_queues WHERE name = 'default'")


async def test_a_mounted_router_answers_its_allowed_hosts_or_behind_its_own_auth(
    db_url: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    """The app names its hosts (`allowed_hosts`), or hands the router its own
    authentication (`auth`, which a rebinding page cannot pass): then the
    app's own host name is served."""
    (tmp_path / "mounted_app.py").write_text(MOUNTED_APP)
    async with _served(db_url, tmp_path / "uvicorn.log", command=("uvicorn", "mounted_app:app"),
                       ) as base, httpx.AsyncClient(base_url=base) as client:
        port = base.rsplit(":", 1)[1]
        for host, code in (("shop.example.org", 201), (f"SHOP.example.org:{port}", 201),
                           (f"rebind.attacker.example:{port}", 400), (f"127.0.0.1:{port}", 400)):
            answer = await client.post("/named/jobs", json={"job_type": "named"},
                                       headers={"host": host})
            assert answer.status_code == code, (host, answer.text)
        named_page = await client.get("/named/", headers={"host": "shop.example.org"})
        assert named_page.status_code == 200 and "Overview" in named_page.text
        staff = {"x-staff-key": "k" * 20}
        for host in ("shop.example.org", f"rebind.attacker.example:{port}"):
            refused = await client.post("/staff/jobs", json={"job_type": "staff"},
                                        headers={"host": host})
            assert refused.status_code == 401 and refused.json()["detail"] == "staff only"
            assert (await client.get("/staff/", headers={"host": host})).status_code == 401
            created = await client.post("/staff/jobs", json={"job_type": "staff"},
                                        headers={"host": host, **staff})
            assert created.status_code == 201, created.text
    assert await conn.fetchval("SELECT array_agg(job_type ORDER BY job_type) FROM jobs") \
        == ["named", "named", "staff", "staff"]


async def test_with_a_token_any_host_name_or_only_the_allowed_ones(
    db_url: str, tmp_path: Path
) -> None:
    token = "t" * 40
    auth = {"authorization": f"Bearer {token}"}
    async with _served(db_url, tmp_path / "any.log", token=token) as base, \
            httpx.AsyncClient(base_url=base) as client:
        # The token is what a rebinding page cannot send: any name will do.
        answer = await client.get("/queues", headers={**auth, "host": "jobs.example.org"})
        assert answer.status_code == 200
    async with _served(db_url, tmp_path / "named.log", "--allowed-host", "jobs.example.org",
                       "--allowed-host", "*.internal.example", token=token) as base, \
            httpx.AsyncClient(base_url=base) as client:
        for host, code in (("jobs.example.org", 200), ("JOBS.example.org:443", 200),
                           ("a.internal.example", 200), ("evil.example", 400),
                           ("internal.example.evil", 400), ("127.0.0.1", 400)):
            answer = await client.get("/queues", headers={**auth, "host": host})
            assert answer.status_code == code, (host, answer.text)


async def test_a_client_that_goes_away_mid_body_is_no_traceback(
    db_url: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    """Issue 49: a client that closed its connection half-way through the
    body of a login form (or of a job) made an 80-line traceback in the
    server's log (`ClientDisconnect`). It is a line at DEBUG now."""
    token = "t" * 40
    log_path = tmp_path / "serve.log"
    async with _served(db_url, log_path, "--log-level", "DEBUG", token=token) as base:
        port = int(base.rsplit(":", 1)[1])
        for head in ("POST /dashboard/login HTTP/1.1\r\n"
                     "Content-Type: application/x-www-form-urlencoded\r\n",
                     f"POST /jobs HTTP/1.1\r\nAuthorization: Bearer {token}\r\n"
                     "Content-Type: application/json\r\n"):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"{head}Host: 127.0.0.1:{port}\r\nContent-Length: 1000\r\n\r\n"
                         "csrf=abc&token=".encode())
            await writer.drain()
            writer.close()
            await writer.wait_closed()

        def gone() -> int:
            return log_path.read_text().count("went away before sending its whole body")
        await wait_for(lambda: gone() == 2, timeout=10, message="both disconnects logged")
    log = log_path.read_text()
    assert "Traceback" not in log and "ClientDisconnect" not in log, log
    assert await conn.fetchval("SELECT count(*) FROM jobs") == 0


async def test_serve_closes_connections_that_do_not_finish_their_headers_in_time(
    db_url: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    """Issue 49: 20 connections that sent a header line now and then
    (slowloris) were all still open after 35 s; uvicorn has no deadline for
    a request's head. With `--header-timeout 1` they are closed within
    seconds, however they trickle; a request whose head came in time is
    answered however long it takes (a cancel waits 2 s for its worker)."""
    job_id = await conn.fetchval("INSERT INTO jobs (job_type) VALUES ('t') RETURNING id")
    async with _served(db_url, tmp_path / "serve.log", "--header-timeout", "1") as base:
        port = int(base.rsplit(":", 1)[1])
        slow = [await asyncio.open_connection("127.0.0.1", port) for _ in range(20)]
        for _, writer in slow:
            writer.write(b"GET /queues HTTP/1.1\r\nHost: 127.0.0.1\r\n")

        async def trickle() -> None:
            """The attacker's pace: one more header line on each, 5 a second."""
            while True:
                for reader, writer in slow:
                    if not reader.at_eof():
                        writer.write(b"X-Still-Here: 1\r\n")
                await asyncio.sleep(0.2)

        trickling = asyncio.create_task(trickle())
        try:
            async with httpx.AsyncClient(base_url=base) as client:
                await claim(conn, job_id)
                cancelling = await client.delete(f"/jobs/{job_id}")
                assert cancelling.status_code == 202, cancelling.text
            answers = await asyncio.wait_for(
                asyncio.gather(*(reader.read() for reader, _ in slow)), timeout=10)
        finally:
            trickling.cancel()
            for _, writer in slow:
                writer.close()
        assert answers == [b""] * 20  # closed, nothing answered
        async with httpx.AsyncClient(base_url=base) as client:
            assert (await client.get("/queues")).status_code == 200


async def test_serve_believes_x_forwarded_for_only_from_the_proxies_named(
    db_url: str, tmp_path: Path
) -> None:
    """Issue 31, item 8: uvicorn believed X-Forwarded-For from loopback, so
    any local process could claim any address: in the access log, and to
    the wrong-token throttle, which a new address each try walked past."""
    token = "t" * 40
    async with _served(db_url, tmp_path / "serve.log", token=token) as base, \
            httpx.AsyncClient(base_url=base) as client:
        for i in range(10):
            forged = {"authorization": f"Bearer guess-{i}", "x-forwarded-for": f"203.0.113.{i}"}
            assert (await client.get("/queues", headers=forged)).status_code == 401
        right = {"authorization": f"Bearer {token}", "x-forwarded-for": "203.0.113.99"}
        answer = await client.get("/queues", headers=right)
        assert answer.status_code == 429 and "from 127.0.0.1" in answer.json()["detail"]
    log = (tmp_path / "serve.log").read_text()
    assert '"GET /queues HTTP/1.1" 401' in log  # the access log was there to read
    assert "203.0.113." not in log
    async with _served(db_url, tmp_path / "proxy.log", "--forwarded-allow-ips", "127.0.0.1",
                       token=token) as base, httpx.AsyncClient(base_url=base) as client:
        for i in range(10):
            behind = {"authorization": f"Bearer guess-{i}", "x-forwarded-for": "203.0.113.7"}
            assert (await client.get("/queues", headers=behind)).status_code == 401
        refused = await client.get("/queues", headers={"authorization": f"Bearer {token}",
                                                       "x-forwarded-for": "203.0.113.7"})
        assert refused.status_code == 429 and "from 203.0.113.7" in refused.json()["detail"]
        other = await client.get("/queues", headers={"authorization": f"Bearer {token}",
                                                     "x-forwarded-for": "203.0.113.8"})
        assert other.status_code == 200
    assert "203.0.113.7" in (tmp_path / "proxy.log").read_text()


@pytest.mark.parametrize(("path", "method", "body", "field"), [
    ("/queues/q1/limits", "PUT", {"rate": "y" * 900_000}, "rate"),
    ("/queues/q1/limits", "PUT", {"concurrency": "y" * 900_000}, "concurrency"),
    ("/jobs", "POST", {"job_type": "t", "priority": "9" * 900_000}, "priority"),
    ("/jobs", "POST", {"job_type": "t", "queue": "q " * 400_000}, "queue"),
    ("/jobs", "POST", {"job_type": "t", "timeout": "s" * 900_000}, "timeout"),
])
async def test_a_422_names_the_field_without_echoing_the_input(
    client: httpx.AsyncClient, path: str, method: str, body: dict[str, Any], field: str
) -> None:
    """A 900 KB value got a 900 KB answer (issue 31, item 7)."""
    answer = await client.request(method, path, json=body)
    assert answer.status_code == 422
    assert len(answer.content) < 1_000, answer.content[:300]
    assert answer.json()["detail"][0]["loc"][-1] == field


@pytest.mark.parametrize(("path", "method", "base"), [
    ("/jobs", "POST", {"job_type": "t"}), ("/queues/q1/limits", "PUT", {"rate": "1/s"})])
async def test_a_422_cuts_the_names_of_unknown_fields_and_their_number(
    client: httpx.AsyncClient, conn: asyncpg.Connection, path: str, method: str,
    base: dict[str, Any]
) -> None:
    """Issue 49: an unknown field is named by its key in the error's `loc`,
    so a 900 KB key got a 900 KB answer; 60,000 unknown keys, as many
    errors (a body under 1 MiB, an answer of 4 MB)."""
    long_key = await client.request(method, path, json={**base, "k" * 900_000: 1})
    assert long_key.status_code == 422
    assert len(long_key.content) < 1_000, long_key.content[:300]
    assert long_key.json()["detail"][0]["loc"] == ["body", "k" * 39 + "…"]
    many_keys = await client.request(method, path,
                                     json={**base, **{f"k{i}": 0 for i in range(60_000)}})
    assert many_keys.status_code == 422
    assert len(many_keys.content) < 5_000, len(many_keys.content)
    detail = many_keys.json()["detail"]
    assert len(detail) == 21 and detail[0]["loc"] == ["body", "k0"]
    assert detail[-1]["msg"] == "and 59,980 more errors"
    assert await conn.fetchval("SELECT count(*) FROM jobs") == 0
