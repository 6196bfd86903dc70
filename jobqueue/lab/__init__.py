"""Helpers the notebooks call, so that cells stay short and logic stays here.

Every notebook gets a database of its own on the embedded PostgreSQL 16 (or on
the server `DATABASE_URL` names), created fresh when the notebook starts and
dropped when it ends, so any notebook runs alone, in any order, as often as
you like.

    from jobqueue import lab
    url = await lab.open_database("advisory_locks")   # first cell
    a = await lab.connect(url, "A")                    # a named connection
    ...
    await lab.close_database("advisory_locks")         # last cell
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import asyncpg

from jobqueue import db, embedded
from jobqueue.lab import examples
from jobqueue.schema import migrations

_open: dict[str, list[asyncpg.Connection]] = {}


def database_name(name: str) -> str:
    return f"lab_{name}"


async def open_database(name: str, *, migrate: bool = True, demo_tables: bool = False) -> str:
    """A fresh database `lab_<name>` (replacing any leftover); its URL.

    migrate: create jobqueue's schema (the `jobs` table, …).
    demo_tables: also the example handlers' tables (demo_users, demo_payments).
    """
    server = embedded.database_url()
    url = await db.create_database(server, database_name(name), replace=True)
    _open[url] = []
    if migrate:
        await migrations.upgrade(url)
    if demo_tables:
        engine = db.create_engine(url)
        async with engine.begin() as conn:
            await examples.create_tables(conn)
        await engine.dispose()
    return url


async def connect(url: str, label: str) -> asyncpg.Connection:
    """A plain connection named `lab <label>` (pg_stat_activity shows the name),
    closed for you by `close_database`."""
    conn = await db.connect(url, application_name=f"lab {label}")
    _open.setdefault(url, []).append(conn)
    return conn


async def close_database(name: str) -> None:
    """Close the notebook's connections and drop its database."""
    server = embedded.database_url()
    url = db.with_database(server, database_name(name))
    for conn in _open.pop(url, []):
        if not conn.is_closed():
            conn.terminate()
    await db.drop_database(server, database_name(name))


def table(rows: Iterable[Mapping[str, Any]] | Iterable[asyncpg.Record]) -> Any:
    """Rows as a pandas DataFrame, for a readable table in the notebook."""
    import pandas as pd

    return pd.DataFrame([dict(r) for r in rows])
