"""Claims read only the jobs of the types a worker has.

idx_jobs_pickable gains `job_type` after `queue`: (queue, job_type,
priority DESC, run_at, id). A worker's claim reads one range per (job
type, priority) of its own types (`queries.sql: claim`), so waiting jobs of
types it has no handler for (another service's, sharing the table) cost it
nothing. Before, each claim stepped over them one heap row at a time to
read their type: beside 1,000,000 such jobs a worker at its defaults
drained 32 times slower than on an empty table.

The new index is built concurrently under a temporary name; then, in one
short transaction, the old one becomes `idx_jobs_waiting` and the new one
takes its name (`online.py`). `idx_jobs_waiting` (queue, priority DESC,
run_at, id) stays: the dashboard lists waiting jobs across types in that
order, and workers of the previous release, which keep running during a
rolling deploy, claim through it. It costs each enqueue one more index
entry.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06
"""

from collections.abc import Sequence

from alembic import op

from jobqueue.schema import online

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PICKABLE = "status IN ('pending', 'retrying')"
BY_TYPE = ["queue", "job_type", "priority DESC", "run_at", "id"]


def upgrade() -> None:
    if online.width("idx_jobs_pickable") == len(BY_TYPE):
        return
    online.create_index("idx_jobs_pickable_new", "jobs", BY_TYPE, where=PICKABLE)
    op.execute("ALTER INDEX idx_jobs_pickable RENAME TO idx_jobs_waiting")
    op.execute("ALTER INDEX idx_jobs_pickable_new RENAME TO idx_jobs_pickable")


def downgrade() -> None:
    online.drop_index("idx_jobs_pickable")
    op.execute("ALTER INDEX idx_jobs_waiting RENAME TO idx_jobs_pickable")
