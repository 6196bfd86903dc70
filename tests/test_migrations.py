"""The migrations and the models describe the same schema."""

from __future__ import annotations

import asyncpg
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.ext.asyncio import create_async_engine

from jobqueue import db
from jobqueue.schema import migrations
from jobqueue.schema.models import Base, described


async def test_models_and_migrations_agree(server_url: str) -> None:
    url = await db.create_database(server_url, "jobqueue_migration_check", replace=True)
    try:
        await migrations.upgrade(url)
        engine = create_async_engine(url)
        async with engine.connect() as conn:
            diff = await conn.run_sync(
                lambda sync: compare_metadata(
                    MigrationContext.configure(sync, opts={
                        "compare_type": True, "compare_server_default": True,
                        "version_table": "jobqueue_alembic_version",
                        "include_name": described}),
                    Base.metadata))
        await engine.dispose()
        assert diff == []
    finally:
        await db.drop_database(server_url, "jobqueue_migration_check")


async def test_migrating_twice_changes_nothing_and_the_trigger_exists(db_url: str) -> None:
    await migrations.upgrade(db_url)
    conn = await asyncpg.connect(**db.asyncpg_connect_args(db_url))
    try:
        head = ScriptDirectory.from_config(migrations.alembic_config()).get_current_head()
        assert await conn.fetchval("SELECT version_num FROM jobqueue_alembic_version") == head
        assert await conn.fetchval(
            "SELECT count(*) FROM pg_trigger WHERE tgname = 'jobs_notify_insert'") == 1
        constraints = {r["conname"] for r in await conn.fetch(
            "SELECT conname FROM pg_constraint WHERE conrelid = 'jobs'::regclass")}
        assert "ck_jobs_status" in constraints
        index = await conn.fetchval(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'idx_jobs_pickable'")
        assert "WHERE" in index and "pending" in index and "retrying" in index
    finally:
        await conn.close()


async def test_the_jobs_table_is_vacuumed_early_and_the_downgrade_resets_it(
    server_url: str
) -> None:
    url = await db.create_database(server_url, "jobqueue_vacuum_check", replace=True)
    conn = await asyncpg.connect(**db.asyncpg_connect_args(url))

    async def options() -> set[str]:
        return set(await conn.fetchval(
            "SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = 'jobs'::regclass"))

    try:
        await migrations.upgrade(url)
        assert {"autovacuum_vacuum_scale_factor=0.02",
                "autovacuum_vacuum_insert_scale_factor=0.05"} <= await options()
        await migrations.downgrade(url, "0002")
        assert await options() == set()
    finally:
        await conn.close()
        await db.drop_database(server_url, "jobqueue_vacuum_check")
