"""The scale benchmark at toy size: the table it builds, every read it
times answering, and a drain beside the backlog that leaves it untouched."""

from __future__ import annotations

import uuid

from jobqueue.benchmarks import scale, scenarios
from jobqueue.ops import routing
from jobqueue.schema import REVISION


async def test_the_table_holds_what_was_asked_and_every_read_answers(bench_url: str) -> None:
    built = await scale.build(bench_url, finished=400, waiting=70, failed_share=0.25)
    assert built["jobs"] == 470
    async with scenarios.connected(bench_url) as conn:
        counts = dict(await conn.fetch("SELECT status, count(*) FROM jobs GROUP BY status"))
        span = await conn.fetchval("SELECT extract(epoch FROM max(completed_at) "
                                   "- min(completed_at)) / 86400 FROM jobs")
        queues = await conn.fetchval("SELECT count(DISTINCT queue) FROM jobs "
                                     "WHERE status = 'pending'")
        indexes = await conn.fetchval("SELECT count(*) FROM pg_indexes WHERE tablename = 'jobs'")
    assert counts == {"completed": 300, "failed": 100, "pending": 70}
    assert 6.9 < span <= 7.0 and queues == scale.BACKLOG_QUEUES
    assert indexes >= 8  # every index rebuilt after the rows

    reads = await scale.operator_reads(bench_url, repeat=1)
    assert {r["read"] for r in reads} >= {"GET /metrics", "GET /queues", "dashboard overview",
                                          "GET /jobs, 11th page", "jobqueue status (the command)"}
    assert {r["answer"] for r in reads} <= {"200", "read", "exit 0"}, reads
    assert all(r["ms"] > 0 for r in reads)


async def test_a_drain_beside_the_backlog_leaves_it_waiting(bench_url: str) -> None:
    await scale.build(bench_url, finished=10, waiting=50)
    row = await scale.drain_beside(bench_url, n=30, flags=("--queues", "default"))
    assert row["n"] == 30 and row["jobs_per_sec"] > 0
    assert row["backlog_left"] == 50 and row["flags"] == "--queues default"


async def test_a_migration_under_traffic_reaches_the_newest_revision_and_says_what_it_cost(
        server_url: str) -> None:
    name = f"t{uuid.uuid4().hex[:8]}"
    url = await scenarios.open_bench(name, revision="0005")
    try:
        await scale.build(url, finished=300, waiting=50)
        row = await scale.migrate_under_traffic(url, rate=200)
    finally:
        await scenarios.close_bench(name)
    assert (row["from"], row["to"]) == ("0005", REVISION)
    assert row["errors"] == "" and row["inserts"] > 0 and row["completed_meanwhile"] >= 0
    assert 0 < row["insert_p50_ms"] <= row["insert_p99_ms"] <= row["insert_max_ms"]


async def test_past_the_exact_count_every_counting_read_says_it_estimates(
        bench_url: str) -> None:
    await scale.build(bench_url, finished=routing.EXACT_FINISHED + 5_000, waiting=20)
    answers = {r["read"]: r["answer"] for r in await scale.operator_reads(bench_url, repeat=1)}
    said = "; estimated: completed, failed"
    assert answers["GET /metrics"] == answers["GET /queues"] == "200" + said, answers
    assert answers["dashboard live refresh"] == "200" + said
    assert answers["jobqueue status, its summary"] == "read" + said
    assert answers["GET /jobs, first page"] == "200"  # lists count nothing


async def test_the_finished_jobs_move_to_the_history_and_retention_drops_days(
        bench_url: str) -> None:
    await scale.build(bench_url, finished=routing.EXACT_FINISHED + 5_000, waiting=20,
                      failed_share=0.25)
    pruned = await scale.delete_as_pruned(bench_url, rows=25, slice_rows=10)
    assert pruned["rows"] == 25 and pruned["statements"] == 3
    moved = await scale.archive_all(bench_url)
    finished = routing.EXACT_FINISHED + 5_000 - 25
    assert moved["rows"] == finished and moved["rows_per_sec"] > 0
    sizes = await scale.sizes(bench_url)
    assert sizes["jobs"] == 20 and sizes["partitions"] >= 14  # two statuses, 7 days and more
    # Past the exact count, but all in the history: counted, not estimated.
    answers = {r["read"]: r["answer"] for r in await scale.operator_reads(bench_url, repeat=1)}
    assert answers["GET /metrics"] == answers["GET /queues"] == "200", answers
    assert answers["jobqueue status, its summary"] == "read"
    async with scenarios.connected(bench_url) as conn:
        oldest = await conn.fetchrow("SELECT id, status FROM jobqueue_history "
                                     "ORDER BY completed_at LIMIT 1")
        found = await conn.fetchval("SELECT status FROM jobqueue_all_jobs WHERE id = $1 AND "
                                    "(completed_at IS NULL OR completed_at >= "
                                    "jobqueue_id_floor($1))", oldest["id"])
    assert found == oldest["status"]  # its id carries the day it was made

    expired = await scale.expire_oldest(bench_url)
    assert expired["statements"] >= 2 and 0 < expired["rows"] < finished
    async with scenarios.connected(bench_url) as conn:
        left = await conn.fetchval("SELECT count(*) FROM jobqueue_history")
        oldest = await conn.fetchval("SELECT extract(epoch FROM now() - min(completed_at)) "
                                     "/ 86400 FROM jobqueue_history")
    assert left == finished - expired["rows"] and oldest < 7
