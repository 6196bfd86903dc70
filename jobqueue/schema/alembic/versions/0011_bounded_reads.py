"""What the operator's reads need to stay small, whatever the history.

`jobqueue status`, `/metrics`, `/queues` and the dashboard count the jobs
by status, queue and type. They used to read the whole table for it: at
ten million finished jobs, seconds per reading. Now the unfinished jobs are
counted exactly from the indexes that hold only them, and the finished ones
are estimated from PostgreSQL's statistics once there are too many to count
(`queries.sql`: `count_unfinished`, `estimate_finished`). Two things make
that possible:

- `idx_jobs_retrying`: the jobs waiting for a retry. idx_jobs_pickable holds
  pending and retrying jobs alike, without their status; this one tells
  them apart, and finds the failed attempts of jobs still in flight. A job
  enters it only when an attempt fails and it is scheduled again, so claims
  and completions never write to it.
- `jobqueue_jobs_kinds`: extended statistics over (status, queue, job_type),
  whose most common combinations ANALYZE samples with the rest of the
  table's statistics; the finished jobs of each queue and type are
  estimated from them. On a table that holds jobs the migration runs
  ANALYZE once, so the estimates do not wait for autovacuum's next pass.

Both are made online: the index concurrently, the statistics and ANALYZE
under a lock that reads and writes pass (`online.py`).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06
"""

from collections.abc import Sequence

from alembic import op
from sqlalchemy import text

from jobqueue.schema import online

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KINDS = "jobqueue_jobs_kinds"


def upgrade() -> None:
    online.create_index("idx_jobs_retrying", "jobs", ["queue", "job_type", "run_at"],
                        where="status = 'retrying'")
    op.execute(f"CREATE STATISTICS IF NOT EXISTS {KINDS} (mcv) "
               "ON status, queue, job_type FROM jobs")
    # A table that holds jobs gets its statistics now; a new one (never
    # analyzed: nothing to estimate) waits for autovacuum like any other.
    if op.get_bind().execute(text("SELECT reltuples FROM pg_class "
                                  "WHERE oid = to_regclass('jobs')")).scalar() > 0:
        op.execute("ANALYZE jobs")


def downgrade() -> None:
    op.execute(f"DROP STATISTICS IF EXISTS {KINDS}")
    online.drop_index("idx_jobs_retrying")
