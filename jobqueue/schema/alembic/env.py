"""Alembic environment: async, on the URL jobqueue.schema.migrations hands in, or DATABASE_URL."""

import asyncio
from logging.config import fileConfig

from alembic import context
from sqlalchemy import pool, text
from sqlalchemy.engine import Connection

from jobqueue.db import create_engine, database_url
from jobqueue.schema.models import Base, described

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logging", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata
VERSION_TABLE = config.get_main_option("version_table", "jobqueue_alembic_version")
#: How long a revision waits for a lock before it gives up and rolls back
#: (`jobqueue.schema.migrations.upgrade` then tries it again).
LOCK_TIMEOUT = config.get_main_option("lock_timeout", "1s")


def _url() -> str:
    return config.attributes.get("database_url") or database_url()


def _configure(connection: Connection | None = None, **kwargs: object) -> None:
    # One transaction per revision: a revision that has to wait for a lock
    # gives up (lock_timeout) and rolls back alone, holding nothing while
    # it is tried again (`jobqueue/schema/online.py`).
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        compare_type=True,
        compare_server_default=True,
        transaction_per_migration=True,
        include_name=described,
        **kwargs,
    )


def run_migrations_offline() -> None:
    """Print the SQL instead of running it (`alembic upgrade head --sql`)."""
    _configure(url=_url(), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def _run_sync(connection: Connection) -> None:
    connection.execute(text("SELECT set_config('lock_timeout', :t, false)"), {"t": LOCK_TIMEOUT})
    connection.commit()  # the revisions' transactions are alembic's own, one each
    _configure(connection)
    with context.begin_transaction():
        context.run_migrations()


async def run_migrations_online() -> None:
    engine = create_engine(_url(), poolclass=pool.NullPool)
    async with engine.connect() as conn:
        await conn.run_sync(_run_sync)
        await conn.commit()
    await engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    connection = config.attributes.get("connection")
    if connection is not None:  # handed in by jobqueue.schema.migrations
        _run_sync(connection)
    else:
        asyncio.run(run_migrations_online())
