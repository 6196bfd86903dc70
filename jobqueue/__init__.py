"""jobqueue: a job queue that needs nothing but PostgreSQL.

    from jobqueue import handlers, enqueue, JobRunner

    @handlers.register("send_email")
    async def send_email(session, payload): ...

    async with sessionmaker() as s, s.begin():
        await enqueue(s, "send_email", {"to": "a@example.com"})

    await JobRunner().run()

Read on: `enqueue` (putting jobs in, inside your transaction), `registry`
(handlers), `worker` (the runner), `queries.sql` (every statement it runs).
"""

from jobqueue.enqueue import enqueue, enqueue_many
from jobqueue.models import Job, JobStatus
from jobqueue.registry import HandlerRegistry, JobHandler, handlers
from jobqueue.retry import RetryPolicy
from jobqueue.worker import JobRunner, current_job

__version__ = "0.1.0"

__all__ = [
    "HandlerRegistry",
    "Job",
    "JobHandler",
    "JobRunner",
    "JobStatus",
    "RetryPolicy",
    "current_job",
    "enqueue",
    "enqueue_many",
    "handlers",
]
