"""The jobs table, its indexes, and the trigger that announces new jobs.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.UUID(), server_default=sa.text("gen_random_uuid()"), nullable=False),
        sa.Column("job_type", sa.String(length=100), nullable=False),
        sa.Column("payload", postgresql.JSONB(), server_default=sa.text("'{}'::jsonb"),
                  nullable=False),
        sa.Column("status", sa.String(length=20), server_default=sa.text("'pending'"),
                  nullable=False),
        sa.Column("retry_count", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("max_retries", sa.Integer(), server_default=sa.text("3"), nullable=False),
        sa.Column("next_retry_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("run_at", sa.DateTime(timezone=True), server_default=sa.text("now()"),
                  nullable=False),
        sa.Column("error_message", sa.String(length=2000), nullable=True),
        sa.Column("error_history", postgresql.JSONB(), server_default=sa.text("'[]'::jsonb"),
                  nullable=False),
        sa.Column("result", postgresql.JSONB(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True),
                  server_default=sa.text("clock_timestamp()"), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("worker_id", sa.Integer(), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'processing', 'completed', 'failed', 'retrying')",
            name=op.f("ck_jobs_status"),
        ),
        sa.CheckConstraint("retry_count >= 0", name=op.f("ck_jobs_retry_count_non_negative")),
        sa.CheckConstraint("max_retries >= 0", name=op.f("ck_jobs_max_retries_non_negative")),
        sa.CheckConstraint("jsonb_typeof(payload) = 'object'",
                           name=op.f("ck_jobs_payload_is_object")),
        sa.CheckConstraint("length(job_type) > 0", name=op.f("ck_jobs_job_type_not_empty")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    op.create_index("idx_jobs_pickable", "jobs", ["run_at"],
                    postgresql_where=sa.text("status IN ('pending', 'retrying')"))
    op.create_index("idx_jobs_processing", "jobs", ["worker_id"],
                    postgresql_where=sa.text("status = 'processing'"))
    op.create_index("idx_jobs_finished", "jobs", ["completed_at"],
                    postgresql_where=sa.text("completed_at IS NOT NULL"))

    # New jobs wake idle workers at once, whoever inserts them (this library,
    # psql, another language). Once per statement, so a bulk insert of 10,000
    # jobs sends one notification; PostgreSQL delivers it at commit, so a
    # rolled-back enqueue wakes nobody.
    op.execute("""
        CREATE FUNCTION jobqueue_notify() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('jobqueue', '');
            RETURN NULL;
        END
        $$
    """)
    op.execute("""
        CREATE TRIGGER jobs_notify_insert
        AFTER INSERT ON jobs
        FOR EACH STATEMENT EXECUTE FUNCTION jobqueue_notify()
    """)


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS jobs_notify_insert ON jobs")
    op.execute("DROP FUNCTION IF EXISTS jobqueue_notify()")
    op.drop_table("jobs")
