"""The `jobs` table, as SQLAlchemy metadata.

The table is the queue: every state a job goes through is a row here, so
`SELECT * FROM jobs` is the whole truth. The migrations in `alembic/` beside
this module create it; this module describes it so that alembic can prove the two agree and so that
applications can query jobs with the ORM if they like. The worker itself never
loads ORM objects: it runs the statements in `queries.sql`.
"""

from __future__ import annotations

import enum
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    CheckConstraint,
    DateTime,
    Index,
    Integer,
    MetaData,
    String,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

#: Longest job type accepted; validated before PostgreSQL has to reject it.
JOB_TYPE_MAX_LENGTH = 100
#: `error_message` keeps at most this many characters of the last error.
ERROR_MESSAGE_MAX_LENGTH = 2000


class JobStatus(enum.StrEnum):
    """The five states of a job.

    pending -> processing -> completed, or -> retrying -> processing -> ...,
    or -> failed once its retries are spent. A job run in a quick batch skips
    `processing`: it is only locked while it runs, and goes from pending (or
    retrying) straight to its outcome in the transaction that ran it.
    """

    PENDING = "pending"
    PROCESSING = "processing"
    COMPLETED = "completed"
    FAILED = "failed"
    RETRYING = "retrying"


STATUS_VALUES = tuple(s.value for s in JobStatus)


class Base(DeclarativeBase):
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(table_name)s_%(column_0_name)s",
            "ck": "ck_%(table_name)s_%(constraint_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


class Job(Base):
    """One unit of work.

    Every column a new job needs has a server-side default, so that
    `INSERT INTO jobs (job_type, payload) VALUES ('x', '{}')` from any tool is a
    valid job that a worker picks up.
    """

    __tablename__ = "jobs"

    id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), primary_key=True, server_default=text("gen_random_uuid()")
    )
    job_type: Mapped[str] = mapped_column(String(JOB_TYPE_MAX_LENGTH))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    status: Mapped[str] = mapped_column(String(20), server_default=text("'pending'"))

    # Retry tracking: retry_count counts retries done (Celery's meaning), so a job
    # that always fails runs max_retries + 1 times.
    retry_count: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    max_retries: Mapped[int] = mapped_column(Integer, server_default=text("3"))
    next_retry_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # When the job is due: now for a new job, later for a scheduled one or a retry
    # waiting out its backoff. The claim compares it with the database's clock.
    run_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=text("now()"))

    # Error tracking
    error_message: Mapped[str | None] = mapped_column(String(ERROR_MESSAGE_MAX_LENGTH))
    error_history: Mapped[list[dict[str, Any]]] = mapped_column(
        JSONB, server_default=text("'[]'::jsonb")
    )
    result: Mapped[Any | None] = mapped_column(JSONB)

    # Timestamps, all from the database's clock. created_at uses clock_timestamp()
    # so that each row of a bulk enqueue gets its own insertion time.
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=text("clock_timestamp()")
    )
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    # The worker that claimed the job last. Every state change a worker makes
    # checks it still owns the job, so a worker that lost a job cannot finish it.
    worker_id: Mapped[int | None] = mapped_column(Integer)

    __table_args__ = (
        CheckConstraint(
            "status IN ('pending', 'processing', 'completed', 'failed', 'retrying')",
            name="status",
        ),
        CheckConstraint("retry_count >= 0", name="retry_count_non_negative"),
        CheckConstraint("max_retries >= 0", name="max_retries_non_negative"),
        CheckConstraint("jsonb_typeof(payload) = 'object'", name="payload_is_object"),
        CheckConstraint("length(job_type) > 0", name="job_type_not_empty"),
        # What a worker scans to claim: only pickable jobs, by due time.
        Index(
            "idx_jobs_pickable",
            "run_at",
            postgresql_where=text("status IN ('pending', 'retrying')"),
        ),
        # What recovery scans: jobs a worker holds.
        Index(
            "idx_jobs_processing",
            "worker_id",
            postgresql_where=text("status = 'processing'"),
        ),
        # What `jobqueue status` and pruning read: recently finished jobs.
        Index(
            "idx_jobs_finished",
            "completed_at",
            postgresql_where=text("completed_at IS NOT NULL"),
        ),
    )


class Worker(Base):
    """A running worker, as it announces itself.

    The heartbeat bounds how long a hung worker (stopped, or its event loop
    blocked) can keep jobs: past the lease, another worker fences it off.
    """

    __tablename__ = "jobqueue_workers"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    name: Mapped[str] = mapped_column(String(200))
    mode: Mapped[str] = mapped_column(String(20))
    state: Mapped[str] = mapped_column(String(20), server_default=text("'standby'"))
    started_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=text("now()")
    )
    heartbeat_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=text("now()")
    )

    __table_args__ = (
        CheckConstraint("mode IN ('exclusive', 'shared')", name="mode"),
        CheckConstraint("state IN ('standby', 'active', 'shared')", name="state"),
    )
