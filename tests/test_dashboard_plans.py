"""A dashboard page costs the same on a million jobs as on a hundred.

The table: a million jobs, most of them completed over the last ten days,
some tens of thousands waiting in ten queues and five priorities, a hundred
running, thousands failed. Each list statement is run as the
dashboard's driver runs it (a prepared statement: custom plans, then the
generic plan PostgreSQL may switch to), for its first page and for a page
deep in the list, under EXPLAIN (ANALYZE, BUFFERS): no plan reads the jobs
table sequentially, and none touches more than a few hundred of its pages
(the table has seventeen thousand). The running list reads all its rows to
sort them, which is as many as the workers hold at once, never the table.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from jobqueue import db
from jobqueue.ops import routing
from jobqueue.schema.models import PRIORITY_MAX
from jobqueue.schema.queries import queries
from tests.conftest import TEMPLATE

JOBS = 1_000_000
NAME = f"test_dashboard_plans_{os.getpid()}"
#: Most pages a page view may touch: the page's rows, their index pages, a
#: few levels of btree; a read of the table would be some 80 times more.
MOST_BUFFERS = 200
LAST_ID = uuid.UUID(int=(1 << 128) - 1)
END = datetime.max.replace(tzinfo=UTC)


@pytest.fixture(scope="module")
async def big(server_url: str, template_url: str) -> AsyncIterator[asyncpg.Connection]:
    url = await db.create_database(server_url, NAME, template=TEMPLATE, replace=True)
    conn = await asyncpg.connect(**db.asyncpg_connect_args(url))
    try:
        indexes = await conn.fetch("SELECT indexname, indexdef FROM pg_indexes "
                                   "WHERE tablename = 'jobs' AND indexname <> 'pk_jobs'")
        for index in indexes:  # built after the rows: much faster than row by row
            await conn.execute(f'DROP INDEX "{index["indexname"]}"')
        await conn.execute("ALTER TABLE jobs DROP CONSTRAINT pk_jobs")
        # Nobody listens: the insert trigger would only keep the million new
        # rows in a transition table to announce ten queues' earliest jobs.
        await conn.execute("ALTER TABLE jobs DISABLE TRIGGER jobs_notify_insert")
        # Ids from md5 of the row number: the default, jobqueue_id(), costs a
        # function call per row (two thirds of this fixture's time).
        await conn.execute(f"""
            INSERT INTO jobs (id, job_type, queue, priority, status, run_at, created_at,
                              started_at, completed_at, worker_id, error_message)
            SELECT CAST(md5(CAST(i AS text)) AS uuid),
                   CASE WHEN i % 3 = 0 THEN 'b' ELSE 'a' END, 'q' || (i % 10), i % 5 - 2,
                   s, t, t,
                   CASE WHEN s <> 'pending' THEN t END,
                   CASE WHEN s IN ('completed', 'failed') THEN t + interval '1 s' END,
                   CASE WHEN s = 'processing' THEN 1 END,
                   CASE WHEN s = 'failed' THEN 'boom' END
            FROM (SELECT i, now() - (i * interval '864 ms') AS t,
                         CASE WHEN i % 10000 < 9500 THEN 'completed'
                              WHEN i % 10000 < 9950 THEN 'pending'
                              WHEN i % 10000 < 9980 THEN 'retrying'
                              WHEN i % 10000 < 9981 THEN 'processing'
                              ELSE 'failed' END AS s
                  FROM generate_series(1, {JOBS}) AS i) AS g""")
        await conn.execute("ALTER TABLE jobs ENABLE TRIGGER jobs_notify_insert")
        await conn.execute("ALTER TABLE jobs ADD CONSTRAINT pk_jobs PRIMARY KEY (id)")
        for index in indexes:
            await conn.execute(index["indexdef"])
        await conn.execute("VACUUM ANALYZE jobs")
        yield conn
    finally:
        await conn.close()
        await db.drop_database(server_url, NAME)


def literal(value: object) -> str:
    """A value as SQL (EXPLAIN EXECUTE takes no bound parameters)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    text = value.isoformat() if isinstance(value, datetime) else str(value)
    return "'" + text.replace("'", "''") + "'"


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


async def deep_row(conn: asyncpg.Connection, where: str, order: str) -> asyncpg.Record:
    """A row half-way down a list: where its 'next page' starts."""
    return await conn.fetchrow(f"SELECT * FROM jobs WHERE {where} ORDER BY {order} "
                               f"OFFSET (SELECT count(*) / 2 FROM jobs WHERE {where}) LIMIT 1")


async def pages(conn: asyncpg.Connection) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each list, first page and a deep one, with the values the dashboard binds."""
    plain = {"queue": None, "job_type": None, "limit": 51}
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for tab, status, at in (("completed", "status = 'completed'", "completed_at"),
                            ("failed", "status = 'failed'", "completed_at"),
                            ("running", "status = 'processing'", "started_at")):
        row = await deep_row(conn, status, f"{at} DESC, id DESC")
        out[f"{tab} first"] = (f"dashboard_{tab}",
                               {**plain, "before_at": END, "before_id": LAST_ID})
        out[f"{tab} deep"] = (f"dashboard_{tab}",
                              {**plain, "before_at": row[at], "before_id": row["id"]})
        out[f"{tab} deep, queue and type"] = (
            f"dashboard_{tab}", {**plain, "queue": row["queue"], "job_type": row["job_type"],
                                 "before_at": row[at], "before_id": row["id"]})
    waiting = "status IN ('pending', 'retrying')"
    row = await deep_row(conn, waiting, "queue, priority DESC, run_at, id")
    first = {"job_type": None, "limit": 51, "run_at": END, "id": LAST_ID}
    out["waiting first"] = ("dashboard_waiting", {**first, "queue": "", "one_queue": False,
                                                  "priority": PRIORITY_MAX + 1})
    out["waiting first, one queue"] = ("dashboard_waiting", {
        **first, "queue": "q7", "one_queue": True, "priority": PRIORITY_MAX + 1})
    out["waiting deep"] = ("dashboard_waiting", {
        **first, "queue": row["queue"], "priority": row["priority"], "run_at": row["run_at"],
        "id": row["id"], "one_queue": False})
    out["series, whole window"] = ("dashboard_series", {"width": 10.0, "back": 60})
    out["series, refresh"] = ("dashboard_series", {"width": 10.0, "back": 1})
    return out


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
async def test_no_dashboard_page_reads_more_than_its_page(big: asyncpg.Connection,
                                                          mode: str) -> None:
    assert await big.fetchval("SELECT count(*) FROM jobs") == JOBS  # there is a lot
    table_pages = await big.fetchval("SELECT relpages FROM pg_class WHERE relname = 'jobs'")
    assert table_pages > 50 * MOST_BUFFERS
    await big.execute(f"SET plan_cache_mode = {mode}")
    costs = {}
    for label, (name, values) in (await pages(big)).items():
        query = queries[name]
        await big.execute(f"PREPARE page AS {query.positional}")
        try:
            args = ", ".join(map(literal, query.args(values)))
            plan = json.loads(await big.fetchval(
                f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE page({args})"))[0]["Plan"]
        finally:
            await big.execute("DEALLOCATE page")
        on_jobs = [n for n in nodes(plan) if n.get("Relation Name") == "jobs"]
        assert on_jobs, label
        assert not [n for n in on_jobs if n["Node Type"] == "Seq Scan"], \
            (label, json.dumps(plan)[:3000])
        costs[label] = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
        if name != "dashboard_series":
            assert plan["Actual Rows"] > 0, label  # the page had rows to find
    assert max(costs.values()) <= MOST_BUFFERS, costs


#: The statements behind `jobqueue status`, `/metrics`, `/queues` and the
#: overview's figures, with the values they bind.
OPERATOR_READS: dict[str, dict[str, Any]] = {
    "count_unfinished": {},
    "count_finished_upto": {"cap": routing.EXACT_FINISHED + 1},
    "estimate_finished": {},
    "queue_health": {},
    "recent_finished": {"window": 300.0},
    "metrics_finished": {"window": 60.0, "neg_bounds": "{-1.0,-0.1,-0.01}"},
    "metrics_failed_attempts": {"window": 300.0},
    "recent_errors": {"window": 300.0, "limit": 5},
}


async def test_the_operators_counts_read_no_finished_job(big: asyncpg.Connection) -> None:
    """Each reads what is unfinished, or finished within its window, through
    an index; the million finished jobs cost it nothing (issue #34)."""
    table_pages = await big.fetchval("SELECT relpages FROM pg_class WHERE relname = 'jobs'")
    costs = {}
    for name, values in OPERATOR_READS.items():
        query = queries[name]
        await big.execute(f"PREPARE reading AS {query.positional}")
        try:
            args = ", ".join(map(literal, query.args(values)))
            plan = json.loads(await big.fetchval(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE reading"
                + (f"({args})" if args else "")))[0]["Plan"]
        finally:
            await big.execute("DEALLOCATE reading")
        assert not [n for n in nodes(plan) if n.get("Relation Name") == "jobs"
                    and n["Node Type"] == "Seq Scan"], (name, json.dumps(plan)[:3000])
        costs[name] = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
    # the waiting jobs' index entries (48,000 here), never the table's pages
    assert max(costs.values()) < table_pages / 20, (table_pages, costs)
    # and what they read adds up to what the table holds
    routes = await routing.read(big)
    assert routes.estimated == routing.FINISHED
    counts = routes.counts()
    truth = dict(await big.fetch("SELECT status, count(*) FROM jobs GROUP BY status"))
    assert {s: counts[s] for s in ("pending", "retrying", "processing")} == {
        s: truth[s] for s in ("pending", "retrying", "processing")}
    assert abs(counts["completed"] - truth["completed"]) < truth["completed"] * 0.02
