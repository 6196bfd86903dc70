"""What holds back vacuum, as `jobqueue status`, `/metrics` and the dashboard
report it: a session idle in a transaction that holds an xid, and then one
only holding a REPEATABLE READ snapshot, while finished jobs' dead row
versions pile up behind them."""

from __future__ import annotations

from typing import Any

import asyncpg
import httpx
from prometheus_client.parser import text_string_to_metric_families

from jobqueue import db
from jobqueue.ops import horizon
from jobqueue.ops import status as report
from jobqueue.ops.cli import format_summary
from jobqueue.testing import wait_for


async def holder_session(db_url: str, name: str) -> asyncpg.Connection:
    return await asyncpg.connect(**db.asyncpg_connect_args(db_url),
                                 server_settings={"application_name": name})


async def test_an_idle_transaction_holding_an_xid_is_named_with_its_age(
        db_url: str, conn: asyncpg.Connection, client: httpx.AsyncClient) -> None:
    assert await horizon.oldest(conn) is None  # nothing else in this database holds one
    analytics = await holder_session(db_url, "nightly analytics")
    try:
        await analytics.execute("BEGIN")
        xid = await analytics.fetchval("SELECT pg_current_xact_id()::text")
        await conn.execute("INSERT INTO jobs (job_type) SELECT 'x' FROM generate_series(1, 20)")
        await conn.execute("DELETE FROM jobs")  # versions vacuum cannot take while it lasts

        async def held() -> horizon.Holder | None:
            h = await horizon.oldest(conn)
            return h if h is not None and (h.age_seconds or 0) > 0.2 else None

        h = await wait_for(held, timeout=10, message="the holder aged")
        assert (h.kind, h.name, h.state) == ("transaction", "nightly analytics",
                                             "idle in transaction")
        assert h.pid == await analytics.fetchval("SELECT pg_backend_pid()")
        assert h.xid_age >= 2 and xid  # the two statements above began after it

        await conn.execute("VACUUM jobs")  # can remove nothing: the page stays
        assert await conn.fetchval("SELECT pg_relation_size('jobs')") > 0

        summary = await report.queue_summary(conn)
        assert summary["horizon"]["name"] == "nightly analytics"
        line = next(x for x in format_summary(summary).splitlines() if "vacuum" in x)
        assert "held for" in line and "'nightly analytics'" in line
        assert "idle in transaction" in line

        families = {f.name: f for f in text_string_to_metric_families(
            (await client.get("/metrics")).text)}
        age = families["jobqueue_xmin_horizon_age_seconds"].samples[0].value
        assert age >= h.age_seconds
        info = families["jobqueue_xmin_horizon_holder_info"].samples
        assert [s.labels for s in info] == [{"kind": "transaction", "name": "nightly analytics",
                                             "state": "idle in transaction"}]
        page = await client.get("/dashboard/overview")
        assert "&#39;nightly analytics&#39;" in page.text  # escaped like everything else
    finally:
        await analytics.close()
    assert await wait_for(lambda: _released(conn), timeout=10, message="released")
    await conn.execute("VACUUM jobs")  # now it removes them, and the empty page
    assert await conn.fetchval("SELECT pg_relation_size('jobs')") == 0

    async def released_in_metrics() -> dict[str, Any] | None:
        # A scrape may be a second old (api.SHARED_TTL).
        families = {f.name: f for f in text_string_to_metric_families(
            (await client.get("/metrics")).text)}
        age = families["jobqueue_xmin_horizon_age_seconds"].samples[0].value
        return families if age == 0 else None

    families = await wait_for(released_in_metrics, timeout=10, message="no holder in metrics")
    assert families["jobqueue_xmin_horizon_holder_info"].samples == []
    assert "nothing holds back vacuum" in format_summary(await report.queue_summary(conn))


async def _released(conn: asyncpg.Connection) -> bool:
    return await horizon.oldest(conn) is None


async def test_a_repeatable_read_snapshot_holds_it_without_an_xid(
        db_url: str, conn: asyncpg.Connection) -> None:
    reader = await holder_session(db_url, "report reader")
    try:
        await reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await reader.fetchval("SELECT count(*) FROM jobs")  # takes the snapshot
        h = await wait_for(lambda: horizon.oldest(conn), timeout=10, message="a holder")
        assert (h.kind, h.name) == ("transaction", "report reader")
        assert await reader.fetchval("SELECT pg_current_xact_id_if_assigned()") is None
    finally:
        await reader.close()


async def test_a_session_in_another_database_is_not_counted(
        db_url: str, server_url: str, conn: asyncpg.Connection) -> None:
    """Since PostgreSQL 14 it holds back only the shared catalogs there."""
    other = await asyncpg.connect(**db.asyncpg_connect_args(server_url),
                                  server_settings={"application_name": "elsewhere"})
    try:
        await other.execute("BEGIN")
        await other.fetchval("SELECT pg_current_xact_id()")
        assert await horizon.oldest(conn) is None
        await conn.execute("INSERT INTO jobs (job_type) SELECT 'x' FROM generate_series(1, 20)")
        await conn.execute("DELETE FROM jobs")
        await conn.execute("VACUUM jobs")  # and it really does not hold this table back
        assert await conn.fetchval("SELECT pg_relation_size('jobs')") == 0
    finally:
        await other.close()
