"""Structured logs: one event per line, text or JSON, from a real worker."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from jobqueue import HandlerRegistry, JobRunner, current_job, db, enqueue, enqueue_many, task
from jobqueue.logs import JsonFormatter, configure_logging
from jobqueue.ops.logs import printable
from jobqueue.testing import drain, wait_for
from tests.conftest import run_cli


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def registry() -> HandlerRegistry:
    r = HandlerRegistry()

    @r.register("ok")
    async def ok(session: AsyncSession, payload: dict[str, Any]) -> None:
        return None

    @r.register("boom")
    async def boom(session: AsyncSession, payload: dict[str, Any]) -> None:
        raise RuntimeError("boom")

    return r


def events(stream: io.StringIO) -> list[dict[str, Any]]:
    lines = stream.getvalue().splitlines()
    assert lines, "nothing was logged"
    return [json.loads(line) for line in lines]  # every line is one JSON object


async def test_json_lines_carry_the_job_fields(engine: AsyncEngine, db_url: str) -> None:
    async with engine.begin() as c:
        done = await enqueue(c, "ok", {})
        failed = await enqueue(c, "boom", {}, max_retries=0)
    stream = io.StringIO()
    configure_logging("DEBUG", "json", stream=stream)
    await drain(db_url, registry=registry())

    logged = events(stream)
    completed = [e for e in logged if e.get("event") == "job_completed"]
    assert [e["job_id"] for e in completed] == [str(done)]
    event = completed[0]
    assert event["level"] == "DEBUG" and event["logger"] == "jobqueue.worker"
    assert event["job_type"] == "ok" and event["attempt"] == 1
    assert isinstance(event["duration_ms"], float) and 0 <= event["duration_ms"] < 10_000
    assert isinstance(event["worker_id"], int) and event["worker_id"] > 0
    assert event["message"] == (f"job {done} (ok) attempt 1 completed in "
                                f"{event['duration_ms']:.1f} ms")
    ts = datetime.fromisoformat(event["ts"])
    assert ts.tzinfo is not None and abs((datetime.now(UTC) - ts).total_seconds()) < 60

    failure = next(e for e in logged if e.get("event") == "job_failed")
    assert failure["level"] == "WARNING" and failure["job_id"] == str(failed)
    assert failure["job_type"] == "boom" and failure["attempt"] == 1
    assert failure["error"] == "RuntimeError: boom" and failure["retry"] is False
    assert failure["duration_ms"] >= 0 and failure["worker_id"] == event["worker_id"]
    stopped = next(e for e in logged if e.get("event") == "worker_stopped")
    assert stopped["report"]["processed"] == 1 and stopped["report"]["failed"] == 1


async def test_text_lines_read_like_sentences(engine: AsyncEngine, db_url: str) -> None:
    async with engine.begin() as c:
        job_id = await enqueue(c, "ok", {})
    stream = io.StringIO()
    configure_logging("DEBUG", "text", stream=stream)
    await drain(db_url, registry=registry())
    pattern = (r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} DEBUG jobqueue\.worker: "
               rf"job {job_id} \(ok\) attempt 1 completed in \d+\.\d ms")
    assert len([ln for ln in stream.getvalue().splitlines() if re.fullmatch(pattern, ln)]) == 1


@pytest.mark.parametrize("level", ["INFO", "WARNING"])
async def test_completions_are_logged_at_debug_only(
        engine: AsyncEngine, db_url: str, level: str) -> None:
    """At INFO (the CLI's default) a worker says it started, sums up and
    stopped, but writes no line per job: failures are WARNINGs at any level."""
    async with engine.begin() as c:
        await enqueue_many(c, "ok", [{}] * 5)
        await enqueue(c, "boom", {}, max_retries=0)
    stream = io.StringIO()
    configure_logging(level, "json", stream=stream)
    report = await drain(db_url, registry=registry())
    assert report["processed"] == 5
    logged = [e.get("event") for e in events(stream)]
    assert "job_completed" not in logged and logged.count("job_failed") == 1
    assert ("worker_stopped" in logged) == (level == "INFO")


async def test_at_info_the_worker_sums_up_every_interval(
        engine: AsyncEngine, db_url: str) -> None:
    """One line per interval in which the worker finished something, and none
    for the idle ones. How many busy intervals the first 21 jobs span depends
    on the machine's speed; a job due half a second later then leaves several
    idle intervals behind it, and adds exactly one line."""
    async with engine.begin() as c:
        await enqueue_many(c, "ok", [{}] * 20)
        await enqueue(c, "boom", {}, max_retries=0)
    stream = io.StringIO()
    configure_logging("INFO", "json", stream=stream)
    runner = JobRunner(db_url, registry=registry(), summary_interval=0.1,
                       install_signal_handlers=False)

    def summaries() -> list[dict[str, Any]]:
        return [e for e in map(json.loads, stream.getvalue().splitlines())
                if e.get("event") == "worker_summary"]

    def summed() -> tuple[int, ...]:
        return tuple(sum(e[k] for e in summaries()) for k in ("completed", "failed", "retried"))

    task = asyncio.create_task(runner.run())
    try:
        await wait_for(lambda: summed() == (20, 1, 0), timeout=30, message="every job summed up")
        busy = len(summaries())
        async with engine.begin() as c:
            later = await c.scalar(text("SELECT clock_timestamp() + interval '0.5 s'"))
            await enqueue(c, "ok", {}, run_at=later)
        await wait_for(lambda: summed() == (21, 1, 0), timeout=30, message="the late job")
    finally:
        runner.stop()
        await task
    lines = summaries()
    assert len(lines) == busy + 1  # the idle intervals before the late job said nothing
    for summary in lines:
        done = (summary["completed"], summary["retried"], summary["failed"])
        assert sum(done) > 0
        assert summary["level"] == "INFO" and summary["worker_id"] == runner.worker_id
        assert summary["jobs_per_sec"] > 0 and 0 < summary["interval_s"] < 30
        assert summary["message"].startswith(f"worker {runner.worker_id}: ")
        assert "{} completed, {} retried, {} failed".format(*done) in summary["message"]
        if not summary["completed"]:
            continue
        assert 0 < summary["latency_p50_ms"] <= summary["latency_p95_ms"] <= summary[
            "latency_p99_ms"]
        p99 = summary["latency_p99_ms"]
        assert summary["message"].endswith(
            f"p99 {p99:,.0f} ms" if p99 >= 100 else f"p99 {p99:.1f} ms" if p99 >= 10
            else f"p99 {p99:.2f} ms")


async def test_a_completion_is_logged_only_once_committed(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection
) -> None:
    """A job whose batch cannot commit (another worker took it meanwhile) ran
    its handler but is not done: no completion may be logged for it."""
    r = registry()
    tamper = await asyncpg.connect(**db.asyncpg_connect_args(db_url))

    @r.register("stolen")
    async def stolen(session: AsyncSession, payload: dict[str, Any]) -> None:
        # As if this worker had been fenced and another one claimed the job.
        await tamper.execute("UPDATE jobs SET worker_id = -1 WHERE id = $1", current_job().id)

    async with engine.begin() as c:
        taken = await enqueue(c, "stolen", {})
    stream = io.StringIO()
    configure_logging("DEBUG", "json", stream=stream)
    try:
        await drain(db_url, registry=r, batch_size=1)
    finally:
        await tamper.close()
    logged = events(stream)
    assert any(e.get("event") == "batch_lost" for e in logged)
    assert not [e for e in logged if e.get("job_id") == str(taken)
                and e.get("event") == "job_completed"]
    assert await conn.fetchval("SELECT status FROM jobs WHERE id = $1", taken) != "completed"


def test_json_formatter_keeps_one_line_and_any_value() -> None:
    logger = logging.getLogger("jobqueue.test")
    record = logger.makeRecord(
        "jobqueue.test", logging.ERROR, __file__, 1, "two\nlines: %s", ("x",), None,
        extra={"job_id": uuid.UUID(int=1), "at": datetime(2030, 1, 1, tzinfo=UTC)})
    try:
        raise RuntimeError("inner")
    except RuntimeError:
        record.exc_info = sys.exc_info()
    line = JsonFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == "two\nlines: x" and entry["level"] == "ERROR"
    assert entry["job_id"] == str(uuid.UUID(int=1)) and entry["at"].startswith("2030-01-01")
    assert "RuntimeError: inner" in entry["exception"]


def test_configure_logging_replaces_its_own_handler_only() -> None:
    root = logging.getLogger()
    other = logging.NullHandler()
    root.addHandler(other)
    first = configure_logging("DEBUG", "text", stream=io.StringIO())
    second = configure_logging("WARNING", "json", stream=io.StringIO())
    assert other in root.handlers and second in root.handlers and first not in root.handlers
    assert root.level == logging.WARNING
    with pytest.raises(ValueError, match="log format"):
        configure_logging("INFO", "xml")  # type: ignore[arg-type]


@pytest.mark.parametrize("position", ["after", "before"])
async def test_worker_log_format_json_from_the_command_line(
    engine: AsyncEngine, db_url: str, position: str
) -> None:
    async with engine.begin() as c:
        job_id = await enqueue(c, "noop", {"to": "a@x"})
    option = ["--log-format", "json", "--log-level", "DEBUG"]
    args = (["worker", *option] if position == "after" else [*option, "worker"])
    result = run_cli(*args, "--import", "tests.handlers", "--burst", url=db_url)
    assert result.returncode == 0, result.stderr
    logged = [json.loads(line) for line in result.stderr.splitlines()]
    done = [e for e in logged if e.get("event") == "job_completed"]
    assert [(e["job_id"], e["job_type"], e["attempt"]) for e in done] == [
        (str(job_id), "noop", 1)]
    assert "duration_ms" in done[0] and "worker_id" in done[0]


def test_an_unknown_log_format_is_a_usage_error() -> None:
    result = run_cli("status", "--log-format", "xml", url=None)
    assert result.returncode == 2 and "invalid choice: 'xml'" in result.stderr


async def test_the_worker_as_the_readme_starts_it_logs_no_line_per_job(
        engine: AsyncEngine, db_url: str) -> None:
    """`jobqueue worker --import …` at its defaults (INFO, text): 30 jobs,
    no completion lines; what it did is in its last line."""
    async with engine.begin() as c:
        await enqueue_many(c, "noop", [{"to": f"{i}@x"} for i in range(30)])
    result = run_cli("worker", "--import", "tests.handlers", "--burst", url=db_url)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert not [ln for ln in lines if "completed in" in ln]
    assert re.search(r"INFO jobqueue\.worker: worker \d+ stopped: .*\"processed\": 30", lines[-1])
    # Its role and what it runs, said once at the start.
    [role] = [ln for ln in lines if "is active;" in ln]
    assert re.search(r"worker \d+ is active; it runs 6 job types \(block, effect, noop, poison, "
                     r"sleep, write_effect\) from every queue$", role), role


FORGED = "x\n2026-12-03 00:00:00,000 INFO jobqueue.worker: FORGED job completed\x1b[2J\u202e"


def test_a_text_log_line_cannot_be_forged_or_rewrite_the_terminal() -> None:
    """What a message quotes (a job type from a plain INSERT, an error's text)
    is escaped: one record, one line, no escape sequence, no bidi override;
    its traceback's rows too (issue 31, item 3)."""
    stream = io.StringIO()
    handler = configure_logging("INFO", "text", stream)
    try:
        logging.getLogger("jobqueue.worker").warning(
            "job %s failed", FORGED, extra={"traceback": f"Traceback\nValueError: {FORGED}"})
    finally:
        logging.getLogger().removeHandler(handler)
    out = stream.getvalue()
    assert "\x1b" not in out and "\u202e" not in out
    first, *below = out.splitlines()
    assert "FORGED" in first and "\\x0a2026-12-03" in first and "\\x1b[2J" in first
    # The traceback keeps its rows, each indented below the line: none can
    # pass for a line of the log.
    assert below[0] == "  Traceback" and all(row.startswith("  ") for row in below)
    assert "\\x1b[2J" in below[-1]


@pytest.mark.parametrize("job_type", [FORGED, "a\x1b[31mred", "a\u202eb", "tab\there"])
async def test_a_job_type_with_control_characters_is_refused(
    client: httpx.AsyncClient, conn: asyncpg.Connection, job_type: str
) -> None:
    answer = await client.post("/jobs", json={"job_type": job_type})
    assert answer.status_code == 422 and "control characters" in answer.text
    assert "FORGED" not in answer.text
    with pytest.raises(ValueError, match="control characters"):
        HandlerRegistry().register(job_type)
    assert await conn.fetchval("SELECT count(*) FROM jobs") == 0


#: Characters that show nothing, or break a line where none is seen.
INVISIBLE = {"line separator": "\u2028", "paragraph separator": "\u2029",
             "arabic letter mark": "\u061c", "zero-width space": "\u200b",
             "right-to-left mark": "\u200f", "zero-width joiner": "\u200d",
             "byte order mark": "\ufeff", "soft hyphen": "\u00ad", "word joiner": "\u2060",
             "tag": "\U000e0041"}


@pytest.mark.parametrize("char", INVISIBLE.values(), ids=INVISIBLE.keys())
async def test_a_job_type_with_invisible_characters_is_refused_everywhere(
    client: httpx.AsyncClient, engine: AsyncEngine, conn: asyncpg.Connection, char: str
) -> None:
    """Issue 49: `send\u200bemail` looks like `send_email`'s neighbour
    `sendemail` and is another type; U+2028 breaks a line where a reader
    sees none. Refused wherever a job type is accepted, with the control
    characters' message; text logs show them escaped."""
    job_type = f"send{char}email"
    answer = await client.post("/jobs", json={"job_type": job_type})
    assert answer.status_code == 422 and "invisible" in answer.text, answer.text
    with pytest.raises(ValueError, match="control characters or invisible ones"):
        HandlerRegistry().register(job_type)
    with pytest.raises(ValueError, match="control characters or invisible ones"):
        async with AsyncSession(engine) as session:
            await enqueue(session, job_type)
    with pytest.raises(ValueError, match="control characters or invisible ones"):
        task(name=job_type, registry=HandlerRegistry())(_a_task)
    assert char not in printable(job_type) and "\\" in printable(job_type)
    assert await conn.fetchval("SELECT count(*) FROM jobs") == 0


def test_the_cli_refuses_a_job_type_with_invisible_characters(db_url: str) -> None:
    done = run_cli("enqueue", "send\u2028email", url=db_url)
    assert done.returncode == 1 and "invisible" in done.stderr, done.stderr
    assert done.stderr.strip().count("\n") == 0 and "Traceback" not in done.stderr


async def _a_task(session: AsyncSession) -> None:
    """A task whose name the test chooses."""


async def test_status_shows_what_a_plain_insert_put_in_escaped(
    db_url: str, conn: asyncpg.Connection
) -> None:
    """A plain INSERT is a valid job and skips enqueue's checks: `jobqueue
    status` escapes what it prints of it."""
    job_id = await conn.fetchval(
        "INSERT INTO jobs (job_type, status, error_message, error_history, completed_at) "
        "VALUES ($1, 'failed', $1, jsonb_build_array(jsonb_build_object("
        "'attempt', 1, 'error', $2::text, 'at', now())), now()) RETURNING id", FORGED, FORGED)
    for args in (["status"], ["status", str(job_id)]):
        done = run_cli(*args, url=db_url)
        assert done.returncode == 0, done.stderr
        assert "\x1b" not in done.stdout and "\u202e" not in done.stdout
        assert "FORGED" in done.stdout and "\n2026-12-03" not in done.stdout
