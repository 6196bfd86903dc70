"""Who holds back vacuum: the oldest transaction (or snapshot, prepared
transaction, replication slot) that pins this database's xmin horizon.

A queue leaves a dead row version behind with every job it finishes, and
vacuum may remove a dead version only once no transaction could still see
it. One long transaction anywhere in the database — an analytics query, a
session left idle in a transaction, a standby's feedback — stops that for
every table at once: dead versions pile up in `jobs` and its indexes, and
each claim steps over more of them. `dead tuples` shows the symptom; this
names the cause. `jobqueue status`, `/metrics` and the dashboard report it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from jobqueue.schema.queries import queries

__all__ = ["Holder", "describe", "oldest"]


@dataclass(frozen=True)
class Holder:
    """The oldest holder of the horizon. `age_seconds`: since its transaction
    began (None for a replication slot, which keeps no time); `xid_age`:
    transactions begun since its snapshot or xid (what vacuum cannot pass)."""

    kind: str  # transaction, standby feedback, prepared transaction, replication slot
    name: str  # application_name, prepared transaction's gid, or slot name
    state: str | None  # a session's state (`idle in transaction`, `active`, …)
    pid: int | None
    age_seconds: float | None
    xid_age: int

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "state": self.state, "pid": self.pid,
                "age_seconds": None if self.age_seconds is None
                else round(max(self.age_seconds, 0.0), 3),
                "xid_age": self.xid_age}


async def oldest(conn: asyncpg.Connection | AsyncConnection | AsyncSession) -> Holder | None:
    """The holder whose snapshot is oldest, or None when nothing else holds one."""
    query = queries["horizon"]
    if isinstance(conn, asyncpg.Connection):
        row: Any = await query.fetchrow(conn)
    else:
        row = (await conn.execute(query.text)).mappings().first()
    if row is None:
        return None
    return Holder(row["kind"], row["name"] or "", row["state"], row["pid"],
                  None if row["age_seconds"] is None else float(row["age_seconds"]),
                  int(row["xid_age"]))


def describe(holder: dict[str, Any] | None) -> str:
    """One line for a person (from `Holder.as_dict`)."""
    if holder is None:
        return "nothing holds back vacuum"
    who = f"{holder['kind']} {holder['name']!r}" if holder["name"] else holder["kind"]
    if holder.get("pid") is not None:
        who += f" (pid {holder['pid']}" + (f", {holder['state']})" if holder.get("state")
                                            else ")")
    age = holder.get("age_seconds")
    since = "" if age is None else f" for {_duration(age)}"
    return f"held{since} by {who}, {holder['xid_age']:,} transactions ago"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
