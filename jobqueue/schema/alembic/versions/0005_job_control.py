"""Job control and faults: a timeout per job, jobs that must run alone, the
ledger of quick batches in flight, and callers waiting for a job.

- `jobs.timeout` (seconds; NULL: none) bounds one attempt of the job.
- `jobs.run_alone`: the job was lost with a worker that died while it ran
  beside others; it runs alone next time, so that a worker dying again names
  it (and counts the attempt) instead of blaming its batch-mates.
- `jobqueue_batches`: the jobs of each quick batch in flight, one row per
  lane, written before the batch runs. A quick batch writes nothing to its
  jobs until it commits, so after a crash this is the only trace of them.
  UNLOGGED: written once per batch without a WAL flush; emptied by a server
  crash, when every batch in flight rolled back anyway.
- `jobqueue_waiters`: callers of `jobqueue.wait()`; finishing a job they wait
  for sends them a notification. UNLOGGED for the same reason.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from jobqueue.schema import online

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the models' rules.
ALONE = "run_alone AND status IN ('pending', 'retrying')"
TIMEOUT_MAX = 31_536_000


def upgrade() -> None:
    op.execute("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS timeout double precision")
    op.execute("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS run_alone boolean "
               "NOT NULL DEFAULT false")
    op.create_table(
        "jobqueue_batches",
        sa.Column("worker_id", sa.Integer(), nullable=False),
        sa.Column("lane", sa.Integer(), nullable=False),
        sa.Column("xid", sa.BigInteger(), nullable=False),
        sa.Column("job_ids", postgresql.ARRAY(postgresql.UUID(as_uuid=True)), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), server_default=sa.text("now()"),
                  nullable=False),
        sa.PrimaryKeyConstraint("worker_id", "lane", name=op.f("pk_jobqueue_batches")),
        prefixes=["UNLOGGED"],
        if_not_exists=True,
    )
    op.create_table(
        "jobqueue_waiters",
        sa.Column("job_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("pid", sa.Integer(), server_default=sa.text("pg_backend_pid()"),
                  nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), server_default=sa.text("now()"),
                  nullable=False),
        sa.PrimaryKeyConstraint("job_id", "pid", name=op.f("pk_jobqueue_waiters")),
        prefixes=["UNLOGGED"],
        if_not_exists=True,
    )
    online.add_check("jobs", "ck_jobs_timeout_range", f"timeout > 0 AND timeout <= {TIMEOUT_MAX}")
    online.create_index("idx_jobs_alone", "jobs", ["queue", "priority DESC", "run_at"],
                        where=ALONE)


def downgrade() -> None:
    op.drop_table("jobqueue_waiters")
    op.drop_table("jobqueue_batches")
    op.drop_index("idx_jobs_alone", table_name="jobs")
    op.drop_column("jobs", "run_alone")
    op.drop_constraint(op.f("ck_jobs_timeout_range"), "jobs", type_="check")
    op.drop_column("jobs", "timeout")
