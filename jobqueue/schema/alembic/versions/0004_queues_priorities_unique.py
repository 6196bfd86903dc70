"""Routing and scheduling: queues, priorities, unique keys, queue settings,
recurring schedules, and what each worker takes.

Every new column has a server default, so a plain `INSERT INTO jobs (job_type,
payload)` is still a valid job (queue `default`, priority 0, no key).

The claim index becomes (queue, priority DESC, run_at): a claim reads one
queue's first entries in the order they run. Building it locks the table
against writes for as long as the build takes (about a second per million
waiting jobs on the benchmark machine); on a larger backlog, create it
yourself first with `CREATE INDEX CONCURRENTLY` under another name, then run
this migration in a quiet moment.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

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
    # A domain, not a table CHECK: checked when a name is written, not on
    # every update of every job (a claim, a completion).
    op.execute(f"CREATE DOMAIN jobqueue_queue_name AS varchar(64) CHECK (VALUE ~ '{QUEUE_NAME}')")
    op.add_column("jobs", sa.Column("queue", QUEUE_TYPE,
                                    server_default=sa.text("'default'"), nullable=False))
    op.add_column("jobs", sa.Column("priority", sa.Integer(), server_default=sa.text("0"),
                                    nullable=False))
    op.add_column("jobs", sa.Column("unique_key", sa.String(length=255), nullable=True))
    op.create_check_constraint(op.f("ck_jobs_priority_range"), "jobs",
                               "priority BETWEEN -1000 AND 1000")
    op.drop_index("idx_jobs_pickable", table_name="jobs")
    op.create_index("idx_jobs_pickable", "jobs",
                    ["queue", sa.text("priority DESC"), "run_at"],
                    postgresql_where=sa.text(PICKABLE))
    op.create_index("uq_jobs_unique_key", "jobs", ["unique_key"], unique=True,
                    postgresql_where=sa.text(UNFINISHED_KEY))

    op.add_column("jobqueue_workers", sa.Column("queues", postgresql.ARRAY(sa.Text()),
                                                nullable=True))
    op.add_column("jobqueue_workers", sa.Column("job_types", postgresql.ARRAY(sa.Text()),
                                                server_default=sa.text("'{}'"),
                                                nullable=False))

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
    )
    op.create_table(
        "jobqueue_schedules",
        sa.Column("job_type", sa.String(length=100), nullable=False),
        sa.Column("schedule", sa.String(length=200), nullable=False),
        sa.Column("last_tick", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"),
                  nullable=False),
        sa.PrimaryKeyConstraint("job_type", name=op.f("pk_jobqueue_schedules")),
    )


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
