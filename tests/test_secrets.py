"""No statement's values in a failed job's error: a card number and an API
key bound to statements that fail, in every handler form a real `jobqueue
worker` runs (`tests/secret_handlers.py`), never reach error_message,
error_history, the stored traceback, `GET /jobs/{id}`, the dashboard's job
page, `jobqueue status ID` or the worker's log; the error itself (its class,
its SQLSTATE, its message) does."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from jobqueue import HandlerRegistry, db, enqueue
from jobqueue.api import TOKEN_ENV, create_app
from jobqueue.testing import WorkerProcess, drain
from tests.conftest import ROOT, TEMPLATE, client_for, run_cli
from tests.secret_handlers import API_KEY, CARD, CHARGE, SEED, TABLES

SECRETS = (CARD, API_KEY)

#: Job type -> what its error must still say: its class, its SQLSTATE (for
#: an error of the server's) and its message.
EXPECTED = {
    "charge_async": ("IntegrityError", "23505", 'violates unique constraint "charges_pkey"'),
    "charge_sync": ("IntegrityError", "23505", 'violates unique constraint "charges_pkey"'),
    "charge_own_connection": ("UniqueViolationError", "23505",
                              'violates unique constraint "charges_pkey"'),
    "number_async": ("DBAPIError", "22003", "is out of range for type integer"),
    "number_sync": ("DataError", "22003", "is out of range for type integer"),
    "token_async": ("DBAPIError", None, "invalid input for query argument $2"),
    "refund_async": ("ForeignKeyViolationError", "23503",
                     'violates foreign key constraint "refunds_card_fkey"'),
    "refund_sync": ("ForeignKeyViolation", "23503",
                    'violates foreign key constraint "refunds_card_fkey"'),
    "charge_wrapped": ("RuntimeError", "23505", "the charge failed: (psycopg.errors.Unique"),
    "charge_task": ("IntegrityError", "23505", 'violates unique constraint "charges_pkey"'),
}


@dataclass
class Failed:
    url: str
    jobs: dict[str, uuid.UUID]
    log: str


@pytest.fixture(scope="module")
async def failed(server_url: str, template_url: str, tmp_path_factory: pytest.TempPathFactory
                 ) -> AsyncIterator[Failed]:
    """One job of each form, run once (no retry) by a burst worker."""
    name = f"test_{uuid.uuid4().hex[:12]}"
    url = await db.create_database(server_url, name, template=TEMPLATE)
    try:
        conn = await asyncpg.connect(**db.asyncpg_connect_args(url))
        try:
            for statement in TABLES:
                await conn.execute(statement)
            await conn.execute(*SEED)
        finally:
            await conn.close()
        engine = db.create_engine(url)
        async with engine.begin() as s:
            jobs = {job_type: await enqueue(s, job_type, {"attempt": 1}, max_retries=0)
                    for job_type in EXPECTED}
        await engine.dispose()
        log_path: Path = tmp_path_factory.mktemp("secrets") / "worker.log"
        worker = WorkerProcess(url, log_path, "--import", "tests.secret_handlers", "--burst",
                               cwd=ROOT)
        try:
            await worker.finish(90)
        finally:
            worker.close()
        yield Failed(url, jobs, worker.log())
    finally:
        await db.drop_database(server_url, name)


def assert_hidden(text: str, where: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{where} shows {secret!r}:\n{text}"


def assert_said(text: str, job_type: str, where: str) -> None:
    """The error itself is there: its class, SQLSTATE and message."""
    for part in EXPECTED[job_type]:
        if part is not None:
            assert part in text, f"{where} does not say {part!r}:\n{text}"


async def _row(url: str, job_id: uuid.UUID) -> asyncpg.Record:
    conn = await asyncpg.connect(**db.asyncpg_connect_args(url))
    try:
        row = await conn.fetchrow(
            "SELECT status, error_message, error_history FROM jobs WHERE id = $1", job_id)
    finally:
        await conn.close()
    assert row is not None and row["status"] == "failed"
    return row


FORMS = pytest.mark.parametrize("job_type", list(EXPECTED))


@FORMS
async def test_error_message(failed: Failed, job_type: str) -> None:
    row = await _row(failed.url, failed.jobs[job_type])
    assert_said(row["error_message"], job_type, "error_message")
    assert_hidden(row["error_message"], "error_message")


@FORMS
async def test_error_history_and_its_traceback(failed: Failed, job_type: str) -> None:
    [entry] = json.loads((await _row(failed.url, failed.jobs[job_type]))["error_history"])
    assert_said(entry["error"], job_type, "error_history")
    assert_hidden(json.dumps(entry, ensure_ascii=False), "error_history")
    trace = entry["traceback"]
    assert "Traceback (most recent call last):" in trace
    if not job_type.startswith("refund"):  # a refund fails at its batch's commit
        assert f"in {job_type}" in trace  # the handler's frame
    assert_said(trace, job_type, "the traceback")
    assert_hidden(trace, "the traceback")


@FORMS
async def test_the_api_and_the_job_page(failed: Failed, job_type: str,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    app = create_app(failed.url)
    job_id = failed.jobs[job_type]
    try:
        async with client_for(app) as web:
            answer = await web.get(f"/jobs/{job_id}")
            page = await web.get(f"/dashboard/jobs/{job_id}")
    finally:
        await app.state.jobqueue_engine.dispose()
    assert answer.status_code == 200 and page.status_code == 200
    api = answer.json()
    assert api["status"] == "failed" and api["error_history"][0]["traceback"]
    assert_said(api["error_message"], job_type, "GET /jobs/{id}")
    assert_hidden(answer.text, "GET /jobs/{id}")
    assert '<details class="traceback">' in page.text and EXPECTED[job_type][0] in page.text
    assert_hidden(page.text, "the job page")


@FORMS
def test_jobqueue_status(failed: Failed, job_type: str) -> None:
    shown = run_cli("status", str(failed.jobs[job_type]), url=failed.url)
    assert shown.returncode == 0, shown.stderr
    assert "attempt 1 failed at" in shown.stdout and '  File "' in shown.stdout
    assert_said(shown.stdout, job_type, "jobqueue status")
    assert_hidden(shown.stdout + shown.stderr, "jobqueue status")


def test_the_worker_log(failed: Failed) -> None:
    log = failed.log
    for job_type, job_id in failed.jobs.items():
        lines = [line for line in log.splitlines()
                 if f"job {job_id} ({job_type}) attempt 1 failed" in line]
        assert lines, f"no failure of {job_type} in the log:\n{log}"
        for line in lines:
            assert_said(line, job_type, "the worker's log")
    assert log.count("Traceback (most recent call last):") >= len(failed.jobs)
    assert_hidden(log, "the worker's log")


async def test_sqlalchemys_own_log_hides_the_values_too(
        db_url: str, conn: asyncpg.Connection, caplog: pytest.LogCaptureFixture) -> None:
    """SQLAlchemy logs each statement with its parameters when its logger is
    at INFO: the worker's engines (async and sync) log them hidden."""
    await conn.execute(TABLES[0])
    registry = HandlerRegistry()

    @registry.register("store_async")
    async def store_async(session: Any, payload: dict[str, Any]) -> None:
        await session.execute(CHARGE, {"card": CARD, "key": API_KEY})

    @registry.register("store_sync")
    def store_sync(session: Any, payload: dict[str, Any]) -> None:
        session.execute(CHARGE, {"card": CARD[::-1], "key": API_KEY})

    engine = db.create_engine(db_url)
    async with engine.begin() as s:
        for job_type in ("store_async", "store_sync"):
            await enqueue(s, job_type)
    await engine.dispose()
    with caplog.at_level(logging.INFO, logger="sqlalchemy.engine"):
        report = await drain(db_url, registry=registry)
    assert report["processed"] == 2
    logged = [r.getMessage() for r in caplog.records if r.name.startswith("sqlalchemy.engine")]
    assert sum("INSERT INTO charges" in line for line in logged) == 2
    assert any("hidden due to hide_parameters=True" in line for line in logged)
    assert not any(secret in line for line in logged for secret in (*SECRETS, CARD[::-1]))
