"""Applying the schema: `alembic upgrade head`, from code or the CLI."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from alembic import command
from alembic.config import Config

from jobqueue import db
from jobqueue.db import database_url

#: The migration scripts: inside the package, so a checkout and an installed
#: wheel find them in the same place.
SCRIPTS = Path(__file__).resolve().parent / "alembic"
#: Alembic's bookkeeping table, named so it never meets an application's own.
VERSION_TABLE = "jobqueue_alembic_version"


def alembic_config(url: str | None = None) -> Config:
    """Alembic's config, built here rather than read from an ini file: the
    `alembic.ini` at a checkout's root only serves the `alembic` command."""
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPTS))
    cfg.set_main_option("path_separator", "os")
    cfg.set_main_option("version_table", VERSION_TABLE)
    cfg.attributes["configure_logging"] = False
    if url:
        cfg.attributes["database_url"] = url
    return cfg


async def upgrade(url: str | None = None, revision: str = "head") -> None:
    """Bring the database's schema to `revision` (the newest by default)."""
    await _run(command.upgrade, url, revision)


async def current(url: str | None = None) -> str | None:
    """The revision the database's schema is at (None: never migrated), read
    from alembic's version table."""
    conn = await db.connect(database_url(url))
    try:
        if not await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", VERSION_TABLE):
            return None
        return await conn.fetchval(  # type: ignore[no-any-return]
            f"SELECT version_num FROM {VERSION_TABLE}")
    finally:
        await conn.close()


async def downgrade(url: str | None, revision: str) -> None:
    """Take the database's schema back to `revision` (`base`: nothing left)."""
    await _run(command.downgrade, url, revision)


async def _run(step: Callable[[Config, str], None], url: str | None, revision: str) -> None:
    engine = db.create_engine(url)
    try:
        async with engine.begin() as conn:

            def run(sync_conn: object) -> None:
                cfg = alembic_config()
                cfg.attributes["connection"] = sync_conn
                step(cfg, revision)

            await conn.run_sync(run)
    finally:
        await engine.dispose()
