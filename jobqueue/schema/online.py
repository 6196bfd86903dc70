"""How the migrations change the `jobs` table while workers run on it.

A live queue's table is written by every enqueue and every claim. A lock
that writers conflict with, held while PostgreSQL reads a large table,
stalls them all; worse, a lock *waited for* stalls them too, since every
writer that comes later queues behind the waiter. So the migrations follow
four rules, with these helpers for the steps that need them:

- **One transaction per revision**, each under `lock_timeout`
  (`migrations.LOCK_TIMEOUT`): a lock that cannot be had at once is given
  up, the revision rolls back, and `migrations.upgrade` tries it again a
  moment later. No revision holds a lock while another one waits.
- **Indexes are built `CONCURRENTLY`** (`create_index`, `replace_index`):
  outside any transaction, without blocking writes.
- **Checks are added `NOT VALID`, then validated** (`add_check`): the add
  takes a brief lock and reads nothing; the validation reads the table
  under a lock that lets writes through.
- **No column change rewrites the table**: a new column is nullable, or has
  a constant default (which PostgreSQL stores once, not in every row).

A revision may stop half-way (its statements outside a transaction commit
one by one), and then runs again from its start: so every step here is
idempotent, and the scripts use `IF NOT EXISTS` for the rest.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op
from sqlalchemy import text


def create_index(name: str, table: str, columns: Sequence[str], *, where: str | None = None,
                 unique: bool = False) -> None:
    """`CREATE INDEX CONCURRENTLY`, unless a valid index of that name is
    there already. One left invalid by an interrupted build is dropped and
    built again (`IF NOT EXISTS` alone would keep it: invalid, never used,
    but still written by every insert)."""
    with op.get_context().autocommit_block():
        valid = _valid(name)
        if valid is True:
            return
        if valid is False:
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
        # The build waits for every transaction that could write the table
        # to end, and lets writes through meanwhile: no lock_timeout for it.
        bind = op.get_bind()
        timeout = bind.execute(text("SHOW lock_timeout")).scalar()
        op.execute("SET lock_timeout = 0")
        try:
            op.execute(f"CREATE {'UNIQUE ' if unique else ''}INDEX CONCURRENTLY {name} "
                       f"ON {table} ({', '.join(columns)})"
                       + (f" WHERE {where}" if where else ""))
        finally:
            bind.execute(text("SELECT set_config('lock_timeout', :t, false)"), {"t": timeout})


def replace_index(name: str, table: str, columns: Sequence[str], *,
                  where: str | None = None) -> None:
    """Give index `name` new columns without a moment when it is missing:
    build the new one beside it under a temporary name, drop the old one,
    rename the new. Done when `name` already has as many columns as
    `columns` (each revision that reshapes an index here changes its
    column count), so a revision that runs again skips what it finished."""
    if width(name) == len(columns):
        return
    staged = f"{name}_new"
    create_index(staged, table, columns, where=where)
    drop_index(name)
    op.execute(f"ALTER INDEX {staged} RENAME TO {name}")


def drop_index(name: str) -> None:
    """`DROP INDEX CONCURRENTLY`: waits for the queries using it, blocks none."""
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")


def add_check(table: str, name: str, condition: str) -> None:
    """A CHECK constraint on a table that may hold millions of rows: added
    `NOT VALID` (a brief lock: new rows are checked from then on, old ones
    not read), then validated in a transaction of its own, which reads
    every row under a lock that writes pass."""
    found = op.get_bind().execute(
        text("SELECT convalidated FROM pg_constraint "
             "WHERE conrelid = to_regclass(:table) AND conname = :name"),
        {"table": table, "name": name}).scalar()
    if found is None:
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} CHECK ({condition}) NOT VALID")
    if found is not True:
        with op.get_context().autocommit_block():
            op.execute(f"ALTER TABLE {table} VALIDATE CONSTRAINT {name}")


def _valid(index: str) -> bool | None:
    """Whether index `index` is valid; None: there is none of that name."""
    return op.get_bind().execute(  # type: ignore[no-any-return]
        text("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:name)"),
        {"name": index}).scalar()


def width(index: str) -> int | None:
    """How many columns index `index` has; None: there is none of that name."""
    return op.get_bind().execute(  # type: ignore[no-any-return]
        text("SELECT indnatts FROM pg_index WHERE indexrelid = to_regclass(:name)"),
        {"name": index}).scalar()
