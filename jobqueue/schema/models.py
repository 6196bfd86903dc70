"""The `jobs` table, as SQLAlchemy metadata.

The table is the queue: every state a job goes through is a row here, so
`SELECT * FROM jobs` is the whole truth. The migrations in `alembic/` beside
this module create it; this module describes it so that alembic can prove the two agree and so that
applications can query jobs with the ORM if they like. The worker itself never
loads ORM objects: it runs the statements in `queries.sql`.
"""

from __future__ import annotations

import enum
import re
import uuid
from datetime import date, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Date,
    DateTime,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, DOMAIN, JSONB, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

#: Longest job type accepted; validated before PostgreSQL has to reject it.
JOB_TYPE_MAX_LENGTH = 100
#: `error_message` keeps at most this many characters of the last error.
ERROR_MESSAGE_MAX_LENGTH = 2000
#: A failed attempt's traceback in `error_history` keeps at most this many
#: characters, its end (where the error was raised) kept first.
TRACEBACK_MAX_LENGTH = 8000
#: What a queue may be called: short, and safe in a URL path, a metric label
#: and a shell command without quoting.
QUEUE_NAME_PATTERN = r"^[A-Za-z0-9_.:-]{1,64}$"
QUEUE_NAME_MAX_LENGTH = 64
#: The queue a job goes to when nobody names one (a plain SQL insert too).
DEFAULT_QUEUE = "default"
#: Priorities run from -1000 to 1000: room for any scheme of levels, and a
#: timestamp or an id passed by mistake is refused instead of sorting first.
PRIORITY_MIN, PRIORITY_MAX = -1000, 1000
#: Longest unique key accepted.
UNIQUE_KEY_MAX_LENGTH = 255
#: Longest timeout accepted, in seconds (a year): anything longer is a
#: mistake of units, not a timeout.
TIMEOUT_MAX = 31_536_000
#: Longest schedule text (a cron expression, or `every Ns`) a schedule row holds.
SCHEDULE_MAX_LENGTH = 200


#: A queue's name as a type: a domain, whose CHECK runs when a value is
#: written into a column of it (an insert, or an update that sets it). A table
#: CHECK would run on every update of every job (each claim and completion),
#: a regular expression per row: measured, it cost a no-op drain about a
#: quarter of the server's time per job.
QUEUE_NAME = DOMAIN("jobqueue_queue_name", String(QUEUE_NAME_MAX_LENGTH),
                    check=f"VALUE ~ '{QUEUE_NAME_PATTERN}'", not_null=False)


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
        UUID(as_uuid=True), primary_key=True, server_default=text("jobqueue_id()")
    )
    job_type: Mapped[str] = mapped_column(String(JOB_TYPE_MAX_LENGTH))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    status: Mapped[str] = mapped_column(String(20), server_default=text("'pending'"))
    # Routing: a worker serves some queues (all by default); among a queue's
    # due jobs, higher priority first, then earlier due time.
    queue: Mapped[str] = mapped_column(QUEUE_NAME, server_default=text(f"'{DEFAULT_QUEUE}'"))
    priority: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    # At most one unfinished job per key (`uq_jobs_unique_key`); NULL: no key.
    unique_key: Mapped[str | None] = mapped_column(String(UNIQUE_KEY_MAX_LENGTH))

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

    # Job control: `timeout` bounds one attempt (seconds; NULL: none);
    # `run_alone` marks a job lost with a worker that died while running it
    # beside others: it runs alone next time, so a death names the culprit.
    timeout: Mapped[float | None] = mapped_column(Float)
    run_alone: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))

    # The worker that claimed the job last. Every state change a worker makes
    # checks it still owns the job, so a worker that lost a job cannot finish it.
    worker_id: Mapped[int | None] = mapped_column(Integer)

    # The W3C trace context of the span that enqueued it (`tracing.py`), for
    # the worker's span to continue; NULL when nothing traced the enqueue.
    trace_context: Mapped[dict[str, str] | None] = mapped_column(JSONB)

    __table_args__ = (
        CheckConstraint(
            "status IN ('pending', 'processing', 'completed', 'failed', 'retrying')",
            name="status",
        ),
        CheckConstraint("retry_count >= 0", name="retry_count_non_negative"),
        CheckConstraint("max_retries >= 0", name="max_retries_non_negative"),
        CheckConstraint("jsonb_typeof(payload) = 'object'", name="payload_is_object"),
        CheckConstraint("length(job_type) > 0", name="job_type_not_empty"),
        CheckConstraint(f"priority BETWEEN {PRIORITY_MIN} AND {PRIORITY_MAX}",
                        name="priority_range"),
        CheckConstraint(f"timeout > 0 AND timeout <= {TIMEOUT_MAX}", name="timeout_range"),
        # What a worker scans to claim: only pickable jobs, one queue and
        # one job type at a time, in the order they run (priority, then due
        # time), so a claim reads the first entries of each of its types and
        # stops, and never steps over jobs of types it cannot run.
        Index(
            "idx_jobs_pickable",
            "queue",
            "job_type",
            text("priority DESC"),
            "run_at",
            "id",
            postgresql_where=text("status IN ('pending', 'retrying')"),
        ),
        # The same across types, in the order jobs run: what the dashboard's
        # list of waiting jobs reads page by page, and the claims of workers
        # of releases before 0010. (A claim may read it too where all the
        # waiting jobs are of its types: then it holds nothing to step over.)
        Index(
            "idx_jobs_waiting",
            "queue",
            text("priority DESC"),
            "run_at",
            "id",
            postgresql_where=text("status IN ('pending', 'retrying')"),
        ),
        # One unfinished job per unique key: the database decides, so two
        # concurrent enqueues cannot both win.
        Index(
            "uq_jobs_unique_key",
            "unique_key",
            unique=True,
            postgresql_where=text(
                "unique_key IS NOT NULL AND status IN ('pending', 'processing', 'retrying')"),
        ),
        # Jobs that must run alone (lost with a crashed batch): few or none,
        # claimed one at a time by a worker with nothing else running.
        Index(
            "idx_jobs_alone",
            "queue",
            text("priority DESC"),
            "run_at",
            postgresql_where=text("run_alone AND status IN ('pending', 'retrying')"),
        ),
        # Jobs waiting for a retry: idx_jobs_pickable holds them with the
        # pending ones, without their status. The operator's counts tell the
        # two apart here, and find the failed attempts of unfinished jobs
        # (0011). Only a failed attempt scheduled again writes to it.
        Index(
            "idx_jobs_retrying",
            "queue",
            "job_type",
            "run_at",
            postgresql_where=text("status = 'retrying'"),
        ),
        # What recovery scans: jobs a worker holds.
        Index(
            "idx_jobs_processing",
            "worker_id",
            postgresql_where=text("status = 'processing'"),
        ),
        # What the dashboard's list of failed jobs reads, newest first: only
        # jobs that failed for good, so the hot path never writes to it.
        Index(
            "idx_jobs_failed",
            "completed_at",
            postgresql_where=text("status = 'failed'"),
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
    # What it takes: the queues it serves (NULL: every queue) and the job
    # types it has handlers for, so an operator sees which waiting jobs no
    # live worker will ever take.
    queues: Mapped[list[str] | None] = mapped_column(ARRAY(Text))
    job_types: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=text("'{}'"))

    __table_args__ = (
        CheckConstraint("mode IN ('exclusive', 'shared')", name="mode"),
        CheckConstraint("state IN ('standby', 'active', 'shared')", name="state"),
    )


class Batch(Base):
    """A quick batch in flight: the jobs one lane locked in its transaction
    (`xid`), written before they run. Its jobs show nothing of it until the
    batch commits, so after a crash this row is what names them (`rescue`).
    One row per lane at a time, replaced (deleted, inserted) by its next
    batch, never updated in place (`queries.sql: record_batch`); UNLOGGED."""

    __tablename__ = "jobqueue_batches"

    worker_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    lane: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    xid: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    job_ids: Mapped[list[uuid.UUID]] = mapped_column(ARRAY(UUID(as_uuid=True)))
    started_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=text("now()")
    )

    __table_args__ = ({"prefixes": ["UNLOGGED"]},)


class Waiter(Base):
    """A caller of `jobqueue.wait()`: finishing the job notifies it. UNLOGGED."""

    __tablename__ = "jobqueue_waiters"

    job_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    pid: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False,
                                     server_default=text("pg_backend_pid()"))
    since: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=text("now()")
    )

    __table_args__ = ({"prefixes": ["UNLOGGED"]},)


class Queue(Base):
    """A queue's fleet-wide settings: paused, a concurrency limit, a rate
    limit. Only queues someone configured have a row; a queue without one
    runs unlimited, and its claims pay one index probe of this small table.

    The rate limit counts starts in fixed windows of `rate_period` seconds
    aligned to the clock (`window_start`, `window_count`): at most
    `rate_limit` jobs start in each.
    """

    __tablename__ = "jobqueue_queues"

    name: Mapped[str] = mapped_column(QUEUE_NAME, primary_key=True)
    paused: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    concurrency: Mapped[int | None] = mapped_column(Integer)
    rate_limit: Mapped[int | None] = mapped_column(Integer)
    rate_period: Mapped[float | None] = mapped_column(Float)
    window_start: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    window_count: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=text("now()")
    )

    __table_args__ = (
        CheckConstraint("concurrency > 0", name="concurrency_positive"),
        CheckConstraint("rate_limit > 0 AND rate_period > 0", name="rate_positive"),
        CheckConstraint("(rate_limit IS NULL) = (rate_period IS NULL)", name="rate_complete"),
    )


class HistoryCount(Base):
    """How many finished jobs of one status, queue and type the history's
    partitions of one day (UTC) hold, kept by the statements that move jobs
    in and out, so the operator's counts are exact without reading them.

    The history itself (`jobqueue_history`, partitioned by status and then
    by day, with partitions the maintenance leader adds and drops) is made
    by migration 0012 and is not described here: SQLAlchemy's metadata has
    no place for partitions that come and go (`HISTORY_TABLES`)."""

    __tablename__ = "jobqueue_history_counts"

    status: Mapped[str] = mapped_column(String(20), primary_key=True)
    day: Mapped[date] = mapped_column(Date, primary_key=True)
    queue: Mapped[str] = mapped_column(QUEUE_NAME, primary_key=True)
    job_type: Mapped[str] = mapped_column(String(JOB_TYPE_MAX_LENGTH), primary_key=True)
    n: Mapped[int] = mapped_column(BigInteger)


#: The history's tables, which the models leave to migration 0012: the
#: partitioned parent, one per status under it, one per day under those.
HISTORY_TABLES = r"^jobqueue_history(_(completed|failed)(_\d{8})?)?$"


def described(name: str | None, type_: str, parent_names: object = None) -> bool:
    """Whether alembic compares this schema object with the models (its
    `include_name` hook): all but the history's tables."""
    return not (type_ == "table" and name is not None and re.match(HISTORY_TABLES, name))


class Schedule(Base):
    """A recurring job (cron or interval) and the last tick enqueued for it.

    The maintenance leader advances `last_tick` and enqueues the tick's job in
    one statement, so a tick is enqueued once however many workers run and
    whichever of them leads.
    """

    __tablename__ = "jobqueue_schedules"

    job_type: Mapped[str] = mapped_column(String(JOB_TYPE_MAX_LENGTH), primary_key=True)
    schedule: Mapped[str] = mapped_column(String(SCHEDULE_MAX_LENGTH))
    last_tick: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=text("now()")
    )


class Session(Base):
    """A dashboard login, until it expires or its owner logs out. The key
    is a digest of the cookie's secret under the API token, so the table
    holds nothing a browser could present, and a new token matches none of
    the old rows (`jobqueue/ops/dashboard/auth.py`)."""

    __tablename__ = "jobqueue_sessions"

    digest: Mapped[bytes] = mapped_column(LargeBinary, primary_key=True)
    started_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=text("now()")
    )
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
