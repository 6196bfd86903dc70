"""Routing and scheduling: queues, priorities, unique keys, queue settings,
recurring schedules, and what each worker takes.

Every new column has a server default, so a plain `INSERT INTO jobs (job_type,
payload)` is still a valid job (queue `default`, priority 0, no key).

The claim index becomes (queue, priority DESC, run_at): a claim reads one
queue's first entries in the order they run. Nothing here rewrites the table
or blocks its writers for more than a moment (`jobqueue/schema/online.py`):
the indexes are built concurrently, the priority check is validated after
it is added, and the queue's domain gets its check after the column (a
column of a domain with a check is checked row by row when it is added: a
rewrite of the whole table under an exclusive lock). That check stays
`NOT VALID`: the rows that were there all hold the default, `default`, and
validating a domain's check would block writes while it reads them.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from jobqueue.schema import online

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the models' rules: a migration must keep meaning what it
# meant when it was written.
QUEUE_NAME = r"^[A-Za-z0-9_.:-]{1,64}$"
PICKABLE = "status IN ('pending', 'retrying')"
UNFINISHED_KEY = "unique_key IS NOT NULL AND status IN ('pending', 'processing', 'retrying')"


QUEUE_TYPE = postgresql.DOMAIN("jobqueue_queue_name", sa.String(length=64),
                              check=f"VALUE ~ '{QUEUE_NAME}'", create_type=False)


def upgrade() -> None:
    op.execute("""
        DO $$ BEGIN
            CREATE DOMAIN jobqueue_queue_name AS varchar(64);
        EXCEPTION WHEN duplicate_object THEN NULL;
        END $$
    """)
    op.execute("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS queue jobqueue_queue_name "
               "NOT NULL DEFAULT 'default'")
    op.execute("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS priority integer NOT NULL DEFAULT 0")
    op.execute("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS unique_key varchar(255)")
    op.execute(f"""
        DO $$ BEGIN
            ALTER DOMAIN jobqueue_queue_name ADD CONSTRAINT jobqueue_queue_name_check
                CHECK (VALUE ~ '{QUEUE_NAME}') NOT VALID;
        EXCEPTION WHEN duplicate_object THEN NULL;
        END $$
    """)
    op.execute("ALTER TABLE jobqueue_workers ADD COLUMN IF NOT EXISTS queues text[]")
    op.execute("ALTER TABLE jobqueue_workers ADD COLUMN IF NOT EXISTS job_types text[] "
               "NOT NULL DEFAULT '{}'")

    op.create_table(
        "jobqueue_queues",
        sa.Column("name", QUEUE_TYPE, nullable=False),
        sa.Column("paused", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=True),
        sa.Column("rate_limit", sa.Integer(), nullable=True),
        sa.Column("rate_period", sa.Float(), nullable=True),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=True),
        sa.Column("window_count", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"),
                  nullable=False),
        sa.CheckConstraint("concurrency > 0",
                           name=op.f("ck_jobqueue_queues_concurrency_positive")),
        sa.CheckConstraint("rate_limit > 0 AND rate_period > 0",
                           name=op.f("ck_jobqueue_queues_rate_positive")),
        sa.CheckConstraint("(rate_limit IS NULL) = (rate_period IS NULL)",
                           name=op.f("ck_jobqueue_queues_rate_complete")),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_jobqueue_queues")),
        if_not_exists=True,
    )
    op.create_table(
        "jobqueue_schedules",
        sa.Column("job_type", sa.String(length=100), nullable=False),
        sa.Column("schedule", sa.String(length=200), nullable=False),
        sa.Column("last_tick", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"),
                  nullable=False),
        sa.PrimaryKeyConstraint("job_type", name=op.f("pk_jobqueue_schedules")),
        if_not_exists=True,
    )
    online.add_check("jobs", "ck_jobs_priority_range", "priority BETWEEN -1000 AND 1000")
    online.replace_index("idx_jobs_pickable", "jobs", ["queue", "priority DESC", "run_at"],
                         where=PICKABLE)
    online.create_index("uq_jobs_unique_key", "jobs", ["unique_key"], unique=True,
                        where=UNFINISHED_KEY)


def downgrade() -> None:
    op.drop_table("jobqueue_schedules")
    op.drop_table("jobqueue_queues")
    op.drop_column("jobqueue_workers", "job_types")
    op.drop_column("jobqueue_workers", "queues")
    op.drop_index("uq_jobs_unique_key", table_name="jobs")
    op.drop_index("idx_jobs_pickable", table_name="jobs")
    op.create_index("idx_jobs_pickable", "jobs", ["run_at"],
                    postgresql_where=sa.text(PICKABLE))
    op.drop_constraint(op.f("ck_jobs_priority_range"), "jobs", type_="check")
    op.drop_column("jobs", "unique_key")
    op.drop_column("jobs", "priority")
    op.drop_column("jobs", "queue")
    op.execute("DROP DOMAIN jobqueue_queue_name")
