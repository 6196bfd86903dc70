"""The claim stays one indexed statement at a million waiting jobs.

A million jobs across ten queues and five priorities, with some of them
scheduled for later, retrying, and of a type the worker has no handler for.
Each statement a worker runs per batch or per idle look is planned as the
worker's prepared statements are (custom plans first, then the generic plan
PostgreSQL switches to after five executions), and no plan may read the jobs
table sequentially.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest

from jobqueue import db
from jobqueue.benchmarks import scale
from jobqueue.schema.locks import QUEUE_LOCK_CLASS
from jobqueue.schema.queries import queries
from tests.conftest import TEMPLATE

WAITING = 1_000_000
QUEUES = 10
NAME = f"test_claim_plan_{os.getpid()}"

#: The statements on the worker's hot path, with the values they run with.
STATEMENTS: dict[str, dict[str, Any]] = {
    "take": {"queue": "q3", "limit": 1000, "arm_types": ["noop", "write_row"] * 5,
             "priorities": [2, 2, 1, 1, 0, 0, -1, -1, -2, -2], "floors": [None] * 10,
             "floor_ids": [None] * 10},
    "claim": {"queue": "q3", "limit": 1, "worker_id": 7, "arm_types": ["noop"] * 5,
              "priorities": [2, 1, 0, -1, -2], "floors": [None] * 5,
              "floor_ids": [None] * 5},
    "claim_limited": {"queue": "q3", "limit": 100, "worker_id": 7,
                      "arm_types": ["noop"] * 5, "priorities": [2, 1, 0, -1, -2]},
    "waiting_queues": {"job_types": ["noop"]},
    "waiting_after": {"queues": ["q3", "q3"], "arm_types": ["noop", "noop"],
                      "priorities": [1, 0], "floors": [None, None], "floor_ids": [None, None]},
    "queue_settings": {},
}
@pytest.fixture(scope="module")
async def big_url(server_url: str, template_url: str) -> AsyncIterator[str]:
    url = await db.create_database(server_url, NAME, template=TEMPLATE, replace=True)
    conn = await asyncpg.connect(**db.asyncpg_connect_args(url))
    try:
        async with scale.bulk_load(conn):
            # Ids spread over the whole uuid range as gen_random_uuid()'s are, made
            # five times faster (md5 of the row number instead of strong random bytes).
            await conn.execute(f"""
                INSERT INTO jobs (id, job_type, queue, priority, status, retry_count, run_at)
                SELECT CAST(md5(CAST(i AS text)) AS uuid),
                       CASE WHEN i % 50 = 0 THEN 'foreign' ELSE 'noop' END,
                       'q' || (i % {QUEUES}), (i / {QUEUES}) % 5 - 2,
                       CASE WHEN i % 20 = 0 THEN 'retrying' ELSE 'pending' END,
                       CASE WHEN i % 20 = 0 THEN 1 ELSE 0 END,
                       now() - interval '1 hour' + (i % 7200) * interval '1 second'
                FROM generate_series(1, {WAITING}) AS i""")
        await conn.execute("INSERT INTO jobqueue_queues (name, concurrency) VALUES ('q3', 5)")
        await conn.execute("VACUUM ANALYZE jobs")
        await conn.execute("ANALYZE jobqueue_queues")
    finally:
        await conn.close()
    yield url
    await db.drop_database(server_url, NAME)


def literal(value: object) -> str:
    """A test value as SQL (EXPLAIN EXECUTE takes no bound parameters)."""
    if value is None:
        return "NULL"
    if isinstance(value, list) and all(v is None for v in value):
        return "'{" + ",".join("NULL" for _ in value) + "}'"  # typed as the parameter
    if isinstance(value, list):
        array = "ARRAY[" + ", ".join(map(literal, value)) + "]"
        return array if all(isinstance(v, int) for v in value) else array + "::text[]"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return str(value)


def outer(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The nodes a node reads its rows from (its InitPlans and CTEs left out)."""
    for child in plan.get("Plans", []):
        if child.get("Parent Relationship") in ("Outer", "Inner", "Member"):
            yield child
            yield from outer(child)


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
@pytest.mark.parametrize("name", list(STATEMENTS))
async def test_no_statement_of_the_hot_path_scans_the_jobs_table(
    big_url: str, name: str, mode: str
) -> None:
    conn = await asyncpg.connect(**db.asyncpg_connect_args(big_url))
    try:
        assert await conn.fetchval("SELECT count(*) FROM jobs") == WAITING  # there is a lot
        await conn.execute(f"SET plan_cache_mode = {mode}")
        query = queries[name]
        await conn.execute(f"PREPARE hot AS {query.positional}")
        args = ", ".join(map(literal, query.args(STATEMENTS[name])))
        explain = f"EXPLAIN (FORMAT JSON) EXECUTE hot({args})" if args \
            else "EXPLAIN (FORMAT JSON) EXECUTE hot"
        if name == "claim_limited":  # runs after lock_queue, in its transaction
            await conn.execute("BEGIN")
            await queries["lock_queue"].execute(conn, lock_class=QUEUE_LOCK_CLASS, queue="q3")
        plan = json.loads(await conn.fetchval(explain))[0]["Plan"]
        if name == "claim_limited":
            await conn.execute("ROLLBACK")
    finally:
        await conn.close()
    on_jobs = [n for n in nodes(plan) if n.get("Relation Name") == "jobs"]
    assert on_jobs or name == "queue_settings"  # the statement reads the jobs table...
    assert not [n for n in on_jobs if n["Node Type"] == "Seq Scan"], json.dumps(plan)[:3000]
    if name in ("take", "claim", "claim_limited"):  # ...through the claim index, in order
        assert any(n.get("Index Name") == "idx_jobs_pickable" for n in on_jobs)
        assert not [n for n in nodes(plan) if n["Node Type"] == "Sort"
                    and any(m.get("Relation Name") == "jobs" for m in outer(n))], \
            json.dumps(plan)[:3000]  # (a sort of the rows taken, at most :limit, is fine)
