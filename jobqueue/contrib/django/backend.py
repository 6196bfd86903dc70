"""The task backend: Django's `Task` and `TaskResult` onto jobqueue's jobs.

| Django | jobqueue |
|---|---|
| a task (`task.module_path`, e.g. `shop.tasks.charge`) | the job type |
| `args`, `kwargs` (JSON, as Django normalises them) | the payload `{"args": [], "kwargs": {}}` |
| `queue_name` | the queue (`QUEUES` lists the allowed ones, as for any backend) |
| `priority`, -100 to 100, higher first | the same number (jobqueue's range is wider) |
| `run_after` | `run_at` |
| `takes_context` | a `TaskContext` whose `attempt` is the job's attempt |
| `TaskResult.id` | the job's id, as text |
| READY / RUNNING / SUCCESSFUL / FAILED | pending or retrying / processing / completed / failed |
| `TaskResult.errors` | each failed attempt of `error_history`, with its traceback |

`enqueue` writes through `django.db.connections[OPTIONS["DATABASE"]]`
(default: "default") with the same statement `jobqueue.enqueue` runs, so a
task enqueued inside `transaction.atomic()` exists exactly when that
transaction commits. `OPTIONS["MAX_RETRIES"]` (default 3) is how many times
a failed task runs again, with the worker's backoff.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import Task, TaskError, TaskResult, TaskResultStatus
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils import timezone
from django.utils.json import normalize_json
from django.utils.module_loading import import_string

from jobqueue import tracing
from jobqueue.enqueue import check_max_retries, check_queue, encode_payload
from jobqueue.schema.models import JobStatus
from jobqueue.schema.queries import queries

__all__ = ["JobqueueBackend"]

#: A job's status as Django's.
STATUSES = {
    JobStatus.PENDING: TaskResultStatus.READY,
    JobStatus.RETRYING: TaskResultStatus.READY,
    JobStatus.PROCESSING: TaskResultStatus.RUNNING,
    JobStatus.COMPLETED: TaskResultStatus.SUCCESSFUL,
    JobStatus.FAILED: TaskResultStatus.FAILED,
}


class JobqueueBackend(BaseTaskBackend):
    """Django tasks as jobqueue jobs, in the project's PostgreSQL."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.database: str = self.options.get("DATABASE", DEFAULT_DB_ALIAS)
        self.max_retries: int = check_max_retries(self.options.get("MAX_RETRIES", 3))

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        try:
            check_queue(task.queue_name)
        except ValueError as e:
            raise InvalidTask(str(e)) from None

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        self.validate_task(task)
        args, kwargs = normalize_json(list(args)), normalize_json(dict(kwargs))
        try:
            payload = encode_payload({"args": args, "kwargs": kwargs})
        except ValueError as e:
            raise InvalidTask(f"{task.module_path}: {e}") from None
        params = {"job_type": task.module_path, "payload": payload,
                  "max_retries": self.max_retries, "run_at": task.run_after,
                  "queue": task.queue_name, "priority": task.priority, "unique_key": None,
                  "timeout": None}
        with tracing.producing(task.module_path, task.queue_name) as produced, \
                connections[self.database].cursor() as cursor:
            cursor.execute(queries["enqueue"].pyformat, {**params,
                                                          "trace_context": produced.context})
            job_id = cursor.fetchone()[0]
            produced.sent([job_id])
        result = TaskResult(
            task=task, id=str(job_id), status=TaskResultStatus.READY,
            enqueued_at=timezone.now(), started_at=None, last_attempted_at=None,
            finished_at=None, args=args, kwargs=kwargs, backend=self.alias, errors=[],
            worker_ids=[])
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        try:
            job_id = uuid.UUID(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        with connections[self.database].cursor() as cursor:
            cursor.execute(queries["get_job"].pyformat, {"id": job_id})
            columns = [column[0] for column in cursor.description]
            row = cursor.fetchone()
        if row is None:
            raise TaskResultDoesNotExist(result_id)
        return self.result_of(dict(zip(columns, row, strict=True)))

    def result_of(self, job: dict[str, Any]) -> TaskResult:
        """A job (`queries.sql: get_job`'s row) as Django's TaskResult."""
        task = task_named(job["job_type"])
        if task is None:
            raise TaskResultDoesNotExist(f"job {job['id']} is not a Django task "
                                         f"({job['job_type']!r})")
        payload, history = _json(job["payload"]), _json(job["error_history"])
        status = STATUSES[JobStatus(job["status"])]
        attempts = len(history) + (job["status"] in (JobStatus.PROCESSING, JobStatus.COMPLETED))
        result = TaskResult(
            task=task, id=str(job["id"]), status=status, enqueued_at=job["created_at"],
            started_at=job["started_at"], last_attempted_at=job["started_at"],
            finished_at=job["completed_at"] if status in (
                TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED) else None,
            args=payload.get("args", []), kwargs=payload.get("kwargs", {}),
            backend=self.alias, errors=[_error(entry) for entry in history],
            worker_ids=[str(job["worker_id"] or "")] * attempts)
        if status == TaskResultStatus.SUCCESSFUL:
            object.__setattr__(result, "_return_value", _json(job["result"]))
        return result


def task_named(path: str) -> Task | None:
    """The task a job type names (its module path), or None."""
    try:
        found = import_string(path)
    except ImportError:
        return None
    return found if isinstance(found, Task) else None


def _json(value: Any) -> Any:
    """A jsonb column as Python: psycopg decodes it, asyncpg gives text."""
    return json.loads(value) if isinstance(value, str) else value


def _error(entry: dict[str, Any]) -> TaskError:
    """A failed attempt as Django's TaskError. The exception's class path is
    the start of the traceback's last line (Python writes `module.Class:`
    there, or the bare name for builtins), or of the error when there is no
    traceback (a timeout is `TimeoutError: ...`); `builtins.Exception` when
    neither names one (a cancel)."""
    trace = entry.get("traceback") or ""
    error = str(entry.get("error", ""))
    last = trace.rstrip().rsplit("\n", 1)[-1] if trace else error
    name = last.split(":", 1)[0].strip() if ":" in last else ""
    if not name or " " in name:
        name = "Exception"
    path = name if "." in name else f"builtins.{name}"
    return TaskError(exception_class_path=path, traceback=trace or error)
