"""Applying the schema: `alembic upgrade head`, from code or the CLI."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from alembic import command
from alembic.config import Config

from jobqueue import db
from jobqueue.db import database_url
from jobqueue.errors import Backoff, is_lock_contention, one_line

logger = logging.getLogger("jobqueue.migrations")

#: The migration scripts: inside the package, so a checkout and an installed
#: wheel find them in the same place.
SCRIPTS = Path(__file__).resolve().parent / "alembic"
#: Alembic's bookkeeping table, named so it never meets an application's own.
VERSION_TABLE = "jobqueue_alembic_version"
#: How long one statement of a revision waits for a lock on a table before
#: the revision gives up and rolls back: every writer that comes later
#: queues behind a waiting lock, so this is how long a migration may stall
#: enqueues and claims at most, each time it tries.
LOCK_TIMEOUT = "1s"
#: Tries of a revision that keeps meeting a lock (each after a backoff of
#: up to 5 s): a minute or two behind a long transaction, then it fails
#: and says which lock it waited for.
TRIES = 30


def alembic_config(url: str | None = None) -> Config:
    """Alembic's config, built here rather than read from an ini file: the
    `alembic.ini` at a checkout's root only serves the `alembic` command."""
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPTS))
    cfg.set_main_option("path_separator", "os")
    cfg.set_main_option("version_table", VERSION_TABLE)
    cfg.set_main_option("lock_timeout", LOCK_TIMEOUT)
    cfg.attributes["configure_logging"] = False
    if url:
        cfg.attributes["database_url"] = url
    return cfg


async def upgrade(url: str | None = None, revision: str = "head") -> None:
    """Bring the database's schema to `revision` (the newest by default),
    one revision per transaction, while workers and enqueues go on: a
    revision that meets a lock it cannot have within LOCK_TIMEOUT rolls
    back and is tried again (the ones before it stay committed)."""
    backoff = Backoff(first=0.2)
    for attempt in range(1, TRIES + 1):
        try:
            await _run(command.upgrade, url, revision)
            return
        except Exception as exc:
            if not is_lock_contention(exc) or attempt == TRIES:
                raise
            delay = backoff.next()
            logger.warning("migration waited too long for a lock (%s); trying again in "
                           "%.1fs (%d of %d)", one_line(exc), delay, attempt, TRIES,
                           extra={"event": "migration_retry", "attempt": attempt})
            await asyncio.sleep(delay)


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
        async with engine.connect() as conn:  # env.py begins one transaction per revision

            def run(sync_conn: object) -> None:
                cfg = alembic_config()
                cfg.attributes["connection"] = sync_conn
                step(cfg, revision)

            await conn.run_sync(run)
    finally:
        await engine.dispose()
