"""Vacuum the jobs table early and often: it is a queue, not an archive.

Every job leaves one or two dead row versions behind (quick batch: one;
claimed: two). PostgreSQL's defaults vacuum a table once a fifth of it is
dead, which on a queue of a million rows is 200,000 dead versions for the
claim's index scan to step over. These settings vacuum at 2 % (plus 2,000
rows), analyze at 5 %, let inserts alone trigger a vacuum (the visibility map
stays fresh for index-only scans), and take half the default naps between
vacuum pages, so vacuum keeps pace with a busy worker. BENCHMARKS.md's long
run shows the dead rows they leave.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SETTINGS = {
    "autovacuum_vacuum_scale_factor": "0.02",
    "autovacuum_vacuum_threshold": "2000",
    "autovacuum_vacuum_insert_scale_factor": "0.05",
    "autovacuum_analyze_scale_factor": "0.05",
    "autovacuum_vacuum_cost_delay": "1",
}


def upgrade() -> None:
    op.execute("ALTER TABLE jobs SET ("
               + ", ".join(f"{key} = {value}" for key, value in SETTINGS.items()) + ")")


def downgrade() -> None:
    op.execute(f"ALTER TABLE jobs RESET ({', '.join(SETTINGS)})")
