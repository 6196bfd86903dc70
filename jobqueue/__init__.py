"""jobqueue: a job queue that needs nothing but PostgreSQL.

    from jobqueue import handlers, enqueue, JobRunner

    @handlers.register("send_email")
    async def send_email(session, payload): ...

    async with sessionmaker() as s, s.begin():
        await enqueue(s, "send_email", {"to": "a@example.com"})

    await JobRunner().run()

Or typed, checked at the call and by mypy (`tasks`, `typed`):

    @task(queue="billing")
    async def charge(session, order_id: int, amount: Decimal) -> Receipt: ...

    job = await charge.enqueue(s, order_id=42, amount=Decimal("9.99"))

Read on, top-down: `enqueue` (putting jobs in, inside your transaction:
to a queue, at a priority, under a unique key, with a timeout), `codec`
(payloads and results as JSON: `to_json` for Decimal, dates, UUIDs,
dataclasses and your own types), `queues`
(pausing and limiting a queue fleet-wide), `control` (`wait` for a job to
finish, by LISTEN; `cancel` one, waiting or running), `registry`
(handlers), `schedules` (when recurring ones tick), `worker/` (what runs
them: `runner` for a worker's life, `lane` and `batch` for a batch, `book`
for what it knows of the queues, `handler` for what a handler sees,
`upkeep` for heartbeat, fencing, rescue and pruning, `scheduler` for the
recurring jobs' ticks, one `WorkerConfig` for all), and `schema/` (the
table, its migrations, and `queries.sql`: every statement the queue runs).
Around them: `db` (URLs and connections; it never starts a server), `ops/`
(the CLI, the HTTP API, metrics, logs, `jobqueue status`), `testing` for
your tests, and `embedded/`, the optional PostgreSQL 16 the CLI and the lab
run on. `lab/` teaches (the lessons' helpers and example handlers) and
`benchmarks/` measures; the queue never imports either.
"""

from jobqueue import control, queues
from jobqueue.codec import to_json
from jobqueue.control import FinishedJob, wait
from jobqueue.enqueue import enqueue, enqueue_many
from jobqueue.registry import HandlerRegistry, JobHandler, handlers
from jobqueue.retry import RetryPolicy
from jobqueue.schema.models import Job, JobStatus
from jobqueue.tasks import Task, TaskJob, task
from jobqueue.worker import JobRunner, Snooze, current_job

__version__ = "0.1.0"

__all__ = [
    "FinishedJob",
    "HandlerRegistry",
    "Job",
    "JobHandler",
    "JobRunner",
    "JobStatus",
    "RetryPolicy",
    "Snooze",
    "Task",
    "TaskJob",
    "control",
    "current_job",
    "enqueue",
    "enqueue_many",
    "handlers",
    "queues",
    "task",
    "to_json",
    "wait",
]
