"""The runnable examples in examples/, run as a user runs them: a fresh
process, `DATABASE_URL` set to a migrated database, and what they print and
write checked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import asyncpg
import httpx

from jobqueue.testing import wait_for
from tests.conftest import wait_answering
from tests.test_quickstart import free_port

ROOT = Path(__file__).resolve().parents[1]


def run_example(name: str, db_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "examples" / name)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "DATABASE_URL": db_url})


async def test_typed_tasks_example(db_url: str, conn: asyncpg.Connection) -> None:
    done = run_example("typed_tasks.py", db_url)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "refused: invoice(): order_id: expected an int, got str '3'"
    assert lines[1].startswith("order 1: completed, 25.00 due ")
    assert lines[2].startswith("order 2: completed, 6.89 due ")
    rows = await conn.fetch("SELECT order_id, total FROM invoices ORDER BY order_id")
    assert [(r["order_id"], str(r["total"])) for r in rows] == [(1, "25.00"), (2, "6.89")]
    assert await conn.fetchval("SELECT count(*) FROM jobs WHERE job_type = 'invoice'") == 2


SLOW_APP = '''
"""examples/fastapi_app.py with one slow task more, to stop the app mid-job."""
import asyncio
import sys

sys.path.insert(0, {examples!r})

from fastapi_app import app  # noqa: E402
from jobqueue import task  # noqa: E402


@task
async def slow(session, seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "finished"
'''


async def test_fastapi_example_enqueues_in_the_request_and_its_worker_stops_gracefully(
    db_url: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    """The order and its job commit or roll back together; the worker in the
    app runs the job; SIGTERM to uvicorn lets a running job finish first."""
    (tmp_path / "slow_app.py").write_text(SLOW_APP.format(examples=str(ROOT / "examples")))
    port = free_port()
    log = open(tmp_path / "uvicorn.log", "w")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "slow_app:app", "--port", str(port)], cwd=tmp_path,
        env={**os.environ, "DATABASE_URL": db_url, "PYTHONUNBUFFERED": "1"}, stdout=log,
        stderr=subprocess.STDOUT)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            await wait_answering(client, "/worker")
            placed = await client.post("/orders", params={"cents": 1999})
            assert placed.status_code == 201, placed.text
            order_id = placed.json()["order_id"]

            async def paid() -> bool:
                return bool(await conn.fetchval(
                    "SELECT paid FROM example_orders WHERE id = $1", order_id))
            await wait_for(paid, timeout=30, message="the in-app worker charging the order")
            assert (await client.get("/worker")).json() == {"role": "active", "completed": 1}
            listed = (await client.get("/queue/jobs")).json()["jobs"]
            assert [job["job_type"] for job in listed] == ["charge"]

            refused = await client.post("/orders", params={"cents": 0})
            assert refused.status_code == 422
            assert await conn.fetchval("SELECT count(*) FROM example_orders") == 1
            assert await conn.fetchval("SELECT count(*) FROM jobs") == 1  # its job rolled back

            await conn.execute("INSERT INTO jobs (job_type, payload) VALUES "
                               "('slow', '{\"seconds\": 1.5}')")

            async def running() -> bool:
                return await conn.fetchval(
                    "SELECT status FROM jobs WHERE job_type = 'slow'") == "processing"
            await wait_for(running, timeout=30, message="the slow job starting")
        server.send_signal(signal.SIGTERM)
        # uvicorn shuts down (the lifespan's end included), then raises the
        # signal again so that the process ends as a SIGTERM'd one.
        assert server.wait(timeout=60) in (0, -signal.SIGTERM)
    finally:
        if server.poll() is None:
            server.kill()
        log.close()
    output = (tmp_path / "uvicorn.log").read_text()
    assert "Application shutdown complete" in output, output
    assert await conn.fetchval("SELECT status FROM jobs WHERE job_type = 'slow'") == "completed"
    assert "Traceback" not in output, output


def test_tracing_example_prints_one_trace_from_the_request_to_the_handler(db_url: str) -> None:
    done = run_example("tracing.py", db_url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "1 trace:",
        "POST /orders (internal)",
        "  send default (producer)",
        "    process default (consumer)",
        "      render receipt (internal)",
    ]
