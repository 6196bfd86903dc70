"""Running a Django project's tasks: finding them, and what runs each.

The worker claims only the job types it has handlers for, so it must know
the tasks before it starts: `discover` imports each installed app's `tasks`
module (and the modules given with `--import`) and registers every Django
`Task` found there whose backend is a `JobqueueBackend`, under its module
path. A task defined elsewhere is found when a `--import` names its module.

What runs a task, and what is atomic with what:
- A task runs in the worker's thread pool (`--threads`), a plain `def` as
  it is and an `async def` through Django's `async_to_sync`, as
  `Task.call` runs it.
- **Django ORM writes are not in the job's transaction.** They go through
  Django's own connection (autocommit, or the task's `transaction.atomic()`),
  and commit when Django commits them: before the job is recorded complete.
  A task that fails after writing keeps those writes, and a worker that dies
  between the task's commit and the job's completion runs the task again.
  So a task runs at least once: make it idempotent, and wrap its writes in
  `transaction.atomic()` so that a failure leaves none of them. (The
  `AsyncSession` handlers of `jobqueue` itself commit with their job, since
  they write on the worker's connection; Django's ORM cannot use it.)
- Old connections are closed before and after each task, as Django does
  around a request, so a worker survives a database restart.

`run_cli` is `jobqueue <command>` with the project's database: its URL is
built from `DATABASES` unless `DATABASE_URL` is set.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Iterable
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, close_old_connections
from django.tasks import task_backends
from django.tasks.base import Task, TaskContext, TaskResult, TaskResultStatus
from django.tasks.signals import task_finished, task_started
from django.utils import timezone
from django.utils.json import normalize_json
from sqlalchemy.engine import URL

from jobqueue.contrib.django.backend import JobqueueBackend
from jobqueue.registry import HandlerRegistry, handlers
from jobqueue.worker import current_job

__all__ = ["database_url", "discover", "run_cli"]

logger = logging.getLogger(__name__)


def discover(modules: Iterable[str] = (), registry: HandlerRegistry = handlers) -> list[str]:
    """Register the project's tasks in `registry`; their job types, sorted."""
    found: dict[str, Task] = {}
    names = [f"{app.name}.tasks" for app in apps.get_app_configs()]
    for name in [*names, *modules]:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name and name not in modules:
                continue  # an app without a tasks module
            raise
        for value in vars(module).values():
            if isinstance(value, Task) and isinstance(value.get_backend(), JobqueueBackend):
                found[value.module_path] = value
    for path, task in found.items():
        registry.add(path, handler_for(task))
    return sorted(found)


def handler_for(task: Task) -> Any:
    """The jobqueue handler that runs `task`: a sync one, in the worker's
    thread pool (an `async def` task runs there too, through Django's
    `async_to_sync`, as `Task.call` runs it)."""
    def run(session: Any, payload: dict[str, Any]) -> Any:
        close_old_connections()
        try:
            return _run(task, payload)
        finally:
            close_old_connections()
    run.__qualname__ = run.__name__ = task.module_path
    return run


def _run(task: Task, payload: dict[str, Any]) -> Any:
    result = _result(task, payload)
    task_started.send(type(task.get_backend()), task_result=result)
    args, kwargs = payload.get("args", []), payload.get("kwargs", {})
    try:
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
        value = normalize_json(value)
    except BaseException:
        _finished(task, result, TaskResultStatus.FAILED)
        raise
    _finished(task, result, TaskResultStatus.SUCCESSFUL)
    return value


def _result(task: Task, payload: dict[str, Any]) -> TaskResult:
    """The running job as Django's TaskResult, for `TaskContext` and the
    signals: its attempt is `len(worker_ids)`."""
    job = current_job()
    now = timezone.now()
    return TaskResult(
        task=task, id=str(job.id), status=TaskResultStatus.RUNNING, enqueued_at=None,
        started_at=now, last_attempted_at=now, finished_at=None,
        args=payload.get("args", []), kwargs=payload.get("kwargs", {}),
        backend=task.backend, errors=[], worker_ids=[str(os.getpid())] * job.attempt)


def _finished(task: Task, result: TaskResult, status: TaskResultStatus) -> None:
    object.__setattr__(result, "status", status)
    object.__setattr__(result, "finished_at", timezone.now())
    task_finished.send(type(task.get_backend()), task_result=result)


def database_url(alias: str | None = None) -> str:
    """The URL of the database the project's jobqueue backend writes to."""
    if alias is None:
        alias = next((backend.database for backend in task_backends.all()
                      if isinstance(backend, JobqueueBackend)), DEFAULT_DB_ALIAS)
    config = settings.DATABASES[alias]
    if "postgresql" not in config.get("ENGINE", ""):
        raise ImproperlyConfigured(f"jobqueue needs PostgreSQL; DATABASES[{alias!r}] is "
                                   f"{config.get('ENGINE')!r}")
    host, port = config.get("HOST") or None, config.get("PORT") or None
    socket = host is not None and host.startswith("/")
    query: dict[str, str] = {"host": host} if socket and host else {}
    url = URL.create("postgresql", username=config.get("USER") or None,
                     password=config.get("PASSWORD") or None,
                     host=None if socket else host, port=int(port) if port and not socket else None,
                     database=config.get("NAME"), query=query)
    return url.render_as_string(hide_password=False)


def setup(settings_module: str | None = None) -> None:
    """Django set up with `settings_module` (default: DJANGO_SETTINGS_MODULE
    as it is), and `DATABASE_URL` pointing at its database unless set."""
    import django

    if settings_module:
        os.environ["DJANGO_SETTINGS_MODULE"] = settings_module
    django.setup()
    if not os.environ.get("DATABASE_URL"):
        os.environ["DATABASE_URL"] = database_url()


def run_cli(argv: list[str]) -> None:
    """`jobqueue <argv>` for this project (the management commands): its
    database, and for `worker` its tasks (`--django`)."""
    from jobqueue.ops import cli

    setup()
    if argv[:1] == ["worker"]:
        argv = ["worker", "--django", os.environ["DJANGO_SETTINGS_MODULE"], *argv[1:]]
    cli.main(argv)
