"""Applying the schema: `alembic upgrade head`, from code or the CLI."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.ext.asyncio import create_async_engine

from jobqueue.db import database_url

_PACKAGE = Path(__file__).resolve().parent


def alembic_config(url: str | None = None) -> Config:
    """Alembic's config, wherever jobqueue is installed.

    In a checkout the scripts are `alembic/` beside the package; an installed
    wheel carries them inside the package as `_alembic/`.
    """
    for ini in (_PACKAGE.parent / "alembic.ini", _PACKAGE / "_alembic" / "alembic.ini"):
        if ini.exists():
            cfg = Config(str(ini))
            if ini.parent == _PACKAGE / "_alembic":
                cfg.set_main_option("script_location", str(ini.parent))
            break
    else:  # pragma: no cover - a broken install
        raise FileNotFoundError("jobqueue's alembic scripts are missing from this install")
    cfg.attributes["configure_logging"] = False
    if url:
        cfg.attributes["database_url"] = url
    return cfg


async def upgrade(url: str | None = None, revision: str = "head") -> None:
    """Bring the database's schema to `revision` (the newest by default)."""
    await _run(command.upgrade, url, revision)


async def downgrade(url: str | None, revision: str) -> None:
    """Take the database's schema back to `revision` (`base`: nothing left)."""
    await _run(command.downgrade, url, revision)


async def _run(step: Callable[[Config, str], None], url: str | None, revision: str) -> None:
    engine = create_async_engine(database_url(url))
    try:
        async with engine.begin() as conn:

            def run(sync_conn: object) -> None:
                cfg = alembic_config()
                cfg.attributes["connection"] = sync_conn
                step(cfg, revision)

            await conn.run_sync(run)
    finally:
        await engine.dispose()
