"""Named SQL statements, loaded from `queries.sql`.

Keeping every statement in one SQL file lets a reader audit what the queue does
to the database in one sitting. Each statement is written once with `:name`
parameters and can be run two ways: through SQLAlchemy (`.text`, used where a
caller's session is involved) or straight on an asyncpg connection
(`.fetch()` and friends, used on the worker's dedicated connection).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from typing import Any

import asyncpg
from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

_HEADER = re.compile(r"^-- (\w+) --$", re.MULTILINE)
# `:name` but not the `::type` of a cast.
_PARAM = re.compile(r"(?<![:\w]):(\w+)")


@dataclass(frozen=True)
class Query:
    name: str
    sql: str
    params: tuple[str, ...] = field(default=())

    @classmethod
    def from_sql(cls, name: str, sql: str) -> Query:
        """A statement with its parameters read off its `:name`s, in order."""
        return cls(name, sql, tuple(dict.fromkeys(_PARAM.findall(sql))))

    @cached_property
    def text(self) -> TextClause:
        """The statement for SQLAlchemy (`session.execute(q.text, {...})`)."""
        return text(self.sql)

    @cached_property
    def positional(self) -> str:
        """The statement with asyncpg's `$1, $2…` placeholders."""
        return _PARAM.sub(lambda m: f"${self.params.index(m.group(1)) + 1}", self.sql)

    @cached_property
    def pyformat(self) -> str:
        """The statement with DB-API's `%(name)s` placeholders (psycopg, and
        Django's cursors on it); a literal `%` doubled."""
        return _PARAM.sub(lambda m: f"%({m.group(1)})s", self.sql.replace("%", "%%"))

    def args(self, values: dict[str, Any]) -> list[Any]:
        missing = set(self.params) - values.keys()
        if missing:
            raise TypeError(f"query {self.name!r} needs {sorted(missing)}")
        return [values[p] for p in self.params]

    async def fetch(self, conn: asyncpg.Connection, **values: Any) -> list[asyncpg.Record]:
        return await conn.fetch(self.positional, *self.args(values))

    async def fetchrow(self, conn: asyncpg.Connection, **values: Any) -> asyncpg.Record | None:
        return await conn.fetchrow(self.positional, *self.args(values))

    async def fetchval(self, conn: asyncpg.Connection, **values: Any) -> Any:
        return await conn.fetchval(self.positional, *self.args(values))

    async def rows(self, conn: asyncpg.Connection | AsyncConnection | AsyncSession,
                   **values: Any) -> list[dict[str, Any]]:
        """The rows as dicts, on either kind of connection: the read-only
        surfaces (`jobqueue status` on asyncpg, the API and the dashboard on
        SQLAlchemy) share their readers."""
        if isinstance(conn, asyncpg.Connection):
            return [dict(r) for r in await self.fetch(conn, **values)]
        return [dict(r) for r in (await conn.execute(self.text, values)).mappings()]

    async def execute(self, conn: asyncpg.Connection, **values: Any) -> str:
        """Run it for its effect; returns the command tag (`DELETE 42`)."""
        return await conn.execute(self.positional, *self.args(values))


def _parse(source: str) -> dict[str, Query]:
    found: dict[str, Query] = {}
    headers = list(_HEADER.finditer(source))
    for header, following in zip(headers, headers[1:] + [None], strict=True):
        end = following.start() if following else len(source)
        body = source[header.end() : end]
        lines = [ln for ln in body.strip().splitlines() if not ln.startswith("--")]
        sql = "\n".join(lines).strip().rstrip(";")
        found[header.group(1)] = Query.from_sql(header.group(1), sql)
    return found


queries: dict[str, Query] = _parse(
    resources.files("jobqueue.schema").joinpath("queries.sql").read_text(encoding="utf-8")
)
