"""Where the database is and how to reach it: URLs and connections only.

A URL passed in wins, then `DATABASE_URL` (SQLAlchemy form,
`postgresql+asyncpg://…`; plain `postgresql://` and `postgres://` are
accepted). With neither, `database_url()` raises ConfigError: a library must
not start a database server behind its user's back. The `jobqueue` command
starts the embedded PostgreSQL 16 itself when `DATABASE_URL` is unset
(`jobqueue.embedded`, an optional extra).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import asyncpg
from sqlalchemy import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine


class ConfigError(ValueError):
    """A setting the user gave cannot work; the message says which and why."""


#: What a ConfigError says when no database was named.
NO_DATABASE = ("no database: pass a URL or set DATABASE_URL (`jobqueue db up` starts the "
               "embedded PostgreSQL 16, `jobqueue db url` prints its URL)")


def database_url(url: str | None = None) -> str:
    """The SQLAlchemy URL to use, with the asyncpg driver: `url`, else
    `DATABASE_URL`, else a ConfigError (never a server started on the quiet)."""
    raw = url or os.environ.get("DATABASE_URL")
    if not raw:
        raise ConfigError(NO_DATABASE)
    return normalize_url(raw)


def normalize_url(raw: str) -> str:
    try:
        parsed = make_url(raw)
    except ArgumentError as e:
        raise ConfigError(f"DATABASE_URL is not a database URL: {raw!r}") from e
    backend = parsed.get_backend_name()
    if backend not in ("postgresql", "postgres"):
        raise ConfigError(f"DATABASE_URL must point to PostgreSQL, not {backend!r}")
    return parsed.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)


def sync_url(url: str) -> str:
    """The same database for psycopg 3, the driver of sync handlers' threads
    (`worker/threads.py`). libpq reads `?host=/folder` (a unix socket folder,
    as the embedded server uses), several `host`s and `target_session_attrs`
    as asyncpg does; asyncpg's `ssl=` is libpq's `sslmode=`."""
    parsed = make_url(normalize_url(url))
    query = dict(parsed.query)
    if "ssl" in query:
        ssl = query.pop("ssl")
        query.setdefault("sslmode", {"true": "require", "false": "disable"}.get(
            str(ssl).lower(), ssl))
    return parsed.set(drivername="postgresql+psycopg", query=query).render_as_string(
        hide_password=False)


def asyncpg_connect_args(url: str) -> dict[str, Any]:
    """asyncpg.connect() keyword arguments for a SQLAlchemy URL."""
    parsed: URL = make_url(url)
    args: dict[str, Any] = {
        "user": parsed.username,
        "password": parsed.password,
        "database": parsed.database,
        "host": parsed.host,
        "port": parsed.port,
    }
    query = dict(parsed.query)
    if "host" in query:  # unix socket folder, as the embedded server uses
        args["host"] = query.pop("host")
    if "port" in query:
        args["port"] = int(query.pop("port"))  # type: ignore[arg-type]
    if "ssl" in query or "sslmode" in query:
        args["ssl"] = query.pop("ssl", None) or query.pop("sslmode")
    return {k: v for k, v in args.items() if v is not None}


async def connect(url: str, application_name: str = "jobqueue",
                  settings: Mapping[str, str] | None = None) -> asyncpg.Connection:
    """A dedicated connection, never pooled: session-level locks and LISTEN
    live on a connection, so the connection must stay ours. `settings`:
    server settings for its session (a `statement_timeout`, say)."""
    return await asyncpg.connect(
        **asyncpg_connect_args(url),
        server_settings={**(settings or {}), "application_name": application_name})


def create_engine(url: str | None = None, **kwargs: Any) -> AsyncEngine:
    """An engine on the configured database, for sessions and lanes."""
    kwargs.setdefault("pool_pre_ping", False)
    return create_async_engine(database_url(url), **kwargs)


def with_database(url: str, name: str) -> str:
    """The same server, another database."""
    return make_url(url).set(database=name).render_as_string(hide_password=False)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def create_database(url: str, name: str, *, template: str | None = None,
                          replace: bool = False) -> str:
    """Create database `name` on `url`'s server (a copy of `template` if given)
    and return its URL. Tests and benchmarks get databases of their own."""
    admin = await connect(with_database(url, "postgres"), application_name="jobqueue admin")
    try:
        if replace:
            await admin.execute(f"DROP DATABASE IF EXISTS {_quote(name)} WITH (FORCE)")
        suffix = f" TEMPLATE {_quote(template)}" if template else ""
        await admin.execute(f"CREATE DATABASE {_quote(name)}{suffix}")
    finally:
        await admin.close()
    return with_database(url, name)


async def drop_database(url: str, name: str) -> None:
    admin = await connect(with_database(url, "postgres"), application_name="jobqueue admin")
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {_quote(name)} WITH (FORCE)")
    finally:
        await admin.close()
