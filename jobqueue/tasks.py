"""Typed tasks: a function with typed parameters, enqueued by calling it.

    @task(queue="billing", priority=5, timeout=30, max_retries=5)
    async def charge(session, order_id: int, amount: Decimal) -> Receipt: ...

    job = await charge.enqueue(session, order_id=42, amount=Decimal("9.99"))
    receipt = (await jobqueue.wait(job)).result          # a Receipt again

Why a layer over `handlers.register` and `enqueue`, which stay: with a
string and a dict, a misspelt type or argument is found by the worker, when
the job fails. A task checks the call against the function's signature and
every value against its annotation before anything is written (a TypeError
at the call, nothing enqueued), and mypy checks the same call before it runs
(the parameters travel as a ParamSpec). The worker reads the arguments back
by the same annotations (`typed.py`), so the function gets a Decimal, not
the string "9.99"; what it returns is checked against its return annotation
and read back as that type by `wait`.

A task is a job type like any other: its name (the function's, unless
`name=` says otherwise) is what the CLI, the API, the dashboard and
`--types` see, and `enqueue(session, "charge", {"order_id": 42, "amount":
"9.99"})` runs the same function. The JSON forms are `typed.py`'s table.

A plain `def` makes a sync task: it runs in the worker's thread pool with a
sync `Session`, like any sync handler. Enqueuing is async either way: it
writes through the caller's `AsyncSession` or `AsyncConnection`, in the
caller's transaction.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from jobqueue.enqueue import (
    Executor,
    check_job_type,
    check_max_retries,
    check_priority,
    check_queue,
    check_run_at,
    check_timeout,
    check_unique_key,
    enqueue,
    enqueue_many,
)
from jobqueue.registry import HandlerRegistry, handlers
from jobqueue.schema.models import DEFAULT_QUEUE
from jobqueue.typed import Converter, converter, located, type_hints

__all__ = ["Task", "TaskArguments", "TaskJob", "TaskOptions", "task"]

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)

_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


@dataclasses.dataclass(frozen=True)
class TaskOptions:
    """What each job of a task is enqueued with (`enqueue`'s keywords): the
    decorator's values, or a `with_options` call's. Checked when made."""

    queue: str = DEFAULT_QUEUE
    priority: int = 0
    max_retries: int = 3
    timeout: float | None = None
    run_at: datetime | None = None
    unique_key: str | None = None

    def __post_init__(self) -> None:
        check_queue(self.queue)
        check_priority(self.priority)
        check_max_retries(self.max_retries)
        check_timeout(self.timeout)
        check_run_at(self.run_at)
        check_unique_key(self.unique_key)


class TaskJob(uuid.UUID, Generic[R_co]):
    """A job's id (a `uuid.UUID`: store it, pass it to `cancel` or the API)
    that also knows its task, so that `jobqueue.wait(job).result` is the
    task's return type again. Pickled or copied it is a plain UUID."""

    __slots__ = ("task",)
    task: Task[..., R_co]

    def __init__(self, job_id: uuid.UUID, task: Task[..., R_co]) -> None:
        super().__init__(int=job_id.int)
        object.__setattr__(self, "task", task)

    def __reduce__(self) -> tuple[Any, ...]:
        return (uuid.UUID, (str(self),))


@dataclasses.dataclass(frozen=True)
class TaskArguments:
    """One call's arguments, checked and encoded (`Task.arguments`): what
    `Task.enqueue_many` takes, one per job."""

    task: str
    payload: dict[str, Any]


class Task(Generic[P, R]):
    """A function registered as a job type, with its signature's converters.
    Made by `@task`. `P` is the function's parameters after the session, `R`
    what calling it returns (a coroutine for an `async def`; `wait` reads
    the result back as what the coroutine gives)."""

    def __init__(self, func: Callable[..., Any], *, name: str, options: TaskOptions,
                 parameters: dict[str, Converter], result: Converter) -> None:
        self.func = func
        self.name = name
        self.options = options
        self._parameters = parameters
        self._result = result
        self._signature = _without_session(inspect.signature(func))
        functools.update_wrapper(self, func)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"<task {self.name!r} {self.func.__module__}.{self.func.__qualname__}>"

    def with_options(self, *, queue: str | None = None, priority: int | None = None,
                     max_retries: int | None = None, timeout: float | None = None,
                     run_at: datetime | None = None,
                     unique_key: str | None = None) -> Task[P, R]:
        """The same task, enqueuing with other options (what is not given
        keeps the task's): `charge.with_options(run_at=t).enqueue(...)`."""
        given: dict[str, Any] = {"queue": queue, "priority": priority, "max_retries": max_retries,
                 "timeout": timeout, "run_at": run_at, "unique_key": unique_key}
        options = dataclasses.replace(
            self.options, **{key: value for key, value in given.items() if value is not None})
        copy = object.__new__(type(self))
        copy.__dict__.update(self.__dict__, options=options)
        return copy

    def arguments(self, *args: P.args, **kwargs: P.kwargs) -> TaskArguments:
        """One call's arguments, checked against the signature and encoded by
        the annotations: a TypeError that names the parameter otherwise."""
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{self.name}(): {e}") from None
        payload = {}
        for key, value in bound.arguments.items():
            try:
                payload[key] = self._parameters[key].encode(value)
            except TypeError as e:
                raise located(f"{self.name}(): {key}", e) from None
        return TaskArguments(self.name, payload)

    async def enqueue(self, session: Executor, /, *args: P.args,
                      **kwargs: P.kwargs) -> TaskJob[R]:
        """Add one job in the caller's transaction (it never commits), with
        the task's options; its id, which `jobqueue.wait` reads back typed."""
        call = self.arguments(*args, **kwargs)
        job_id = await enqueue(session, self.name, call.payload,
                                         **dataclasses.asdict(self.options))
        return TaskJob(job_id, self)

    async def enqueue_many(self, session: Executor,
                           calls: Iterable[TaskArguments]) -> list[TaskJob[R]]:
        """Many jobs in one statement, one per `self.arguments(...)`, with the
        task's options (no unique key: see `jobqueue.enqueue_many`)."""
        if self.options.unique_key is not None:
            raise ValueError("enqueue_many takes no unique key: one statement cannot report "
                             "which keys were held; enqueue keyed jobs one by one")
        payloads = []
        for i, call in enumerate(calls):
            if not isinstance(call, TaskArguments) or call.task != self.name:
                raise TypeError(f"call #{i} is not {self.name}.arguments(...): {call!r}")
            payloads.append(call.payload)
        options = dataclasses.asdict(self.options)
        del options["unique_key"]
        ids = await enqueue_many(session, self.name, payloads, **options)
        return [TaskJob(job_id, self) for job_id in ids]

    def __call__(self, session: Any, *args: P.args, **kwargs: P.kwargs) -> R:
        """The function itself, called directly (in a test, say)."""
        result: R = self.func(session, *args, **kwargs)
        return result

    def decode_arguments(self, payload: dict[str, Any]) -> dict[str, Any]:
        """A job's payload as the function's keyword arguments; a TypeError
        that says which one does not fit (the job fails, saying so)."""
        unknown = [key for key in payload if key not in self._parameters]
        if unknown:
            raise TypeError(f"{self.name}() has no parameter {unknown[0]!r}")
        kwargs = {}
        for key, value in payload.items():
            try:
                kwargs[key] = self._parameters[key].decode(value)
            except TypeError as e:
                raise located(f"{self.name}(): {key}", e) from None
        try:
            self._signature.bind(**kwargs)
        except TypeError as e:
            raise TypeError(f"{self.name}(): {e}") from None
        return kwargs

    def encode_result(self, value: Any) -> Any:
        """What the function returned, as JSON, checked against its return
        annotation (a TypeError fails the job: nothing could read it back)."""
        try:
            return self._result.encode(value)
        except TypeError as e:
            raise located(f"{self.name}() returned", e) from None

    def decode_result(self, value: Any) -> Any:
        """A completed job's stored result as the return annotation's type."""
        try:
            return self._result.decode(value)
        except TypeError as e:
            raise located(f"result of {self.name}()", e) from None


@overload
def task(func: Callable[Concatenate[Any, P], R], /) -> Task[P, R]: ...


@overload
def task(*, name: str | None = None, queue: str = DEFAULT_QUEUE, priority: int = 0,
         timeout: float | None = None, max_retries: int = 3, cron: str | None = None,
         every: int | None = None, registry: HandlerRegistry | None = None
         ) -> Callable[[Callable[Concatenate[Any, P], R]], Task[P, R]]: ...


def task(func: Callable[..., Any] | None = None, /, *, name: str | None = None,
         queue: str = DEFAULT_QUEUE, priority: int = 0, timeout: float | None = None,
         max_retries: int = 3, cron: str | None = None, every: int | None = None,
         registry: HandlerRegistry | None = None) -> Any:
    """Make `func(session, ...)` a task: `@task` or `@task(queue=..., ...)`.

    `name`: the job type (default: the function's name). `queue`,
    `priority`, `max_retries`: what its jobs are enqueued with unless
    `with_options` says otherwise. `timeout`: seconds one attempt may run,
    the type's default (`register(..., timeout=)`), so it applies to jobs
    enqueued by name too. `cron=` or `every=` make it recur (every parameter
    then needs a default; each tick runs it with none given). `registry`:
    where the handler goes (default: `jobqueue.handlers`, the one `jobqueue
    worker` runs).

    Everything is checked here: a parameter the worker could not read back
    (see `jobqueue.typed`), `*args`, a positional-only parameter, or a bad
    option is an error at the decorator, and nothing is registered.
    """
    options = TaskOptions(queue=queue, priority=priority, max_retries=max_retries)

    def decorate(func: Callable[..., Any]) -> Task[Any, Any]:
        made = _make(func, name or str(getattr(func, "__name__", "")), options)
        scheduled = cron is not None or every is not None
        if scheduled:
            required = [p.name for p in made._signature.parameters.values()
                        if p.default is inspect.Parameter.empty]
            if required:
                raise TypeError(f"task {made.name!r} recurs, so each tick runs it with no "
                                f"arguments: give {required[0]!r} a default")
        (registry if registry is not None else handlers).register(
            made.name, cron=cron, every=every, timeout=timeout,
            queue=queue if scheduled else None, priority=priority if scheduled else None,
        )(_handler(made))
        return made

    return decorate if func is None else decorate(func)


def _make(func: Callable[..., Any], name: str, options: TaskOptions) -> Task[Any, Any]:
    if not callable(func):
        raise TypeError(f"@task decorates a function, not {type(func).__name__}")
    check_job_type(name)
    where = f"task {name!r}"
    signature = inspect.signature(func)
    if not signature.parameters:
        raise TypeError(f"{where}: its first parameter is the session; it has none")
    hints = type_hints(func, where)
    parameters = {}
    for parameter in _without_session(signature).parameters.values():
        if parameter.kind not in _KINDS:
            raise TypeError(f"{where}: parameter {parameter.name!r} is "
                            f"{parameter.kind.description}; a task's arguments are stored by name")
        parameters[parameter.name] = converter(hints.get(parameter.name, Any),
                                               where=f"{where}, parameter {parameter.name!r}")
    result = converter(hints.get("return", Any), where=f"{where}, its return annotation")
    return Task(func, name=name, options=options, parameters=parameters, result=result)


def _without_session(signature: inspect.Signature) -> inspect.Signature:
    """The signature a caller fills: every parameter after the session."""
    return signature.replace(parameters=list(signature.parameters.values())[1:])


def _handler(made: Task[Any, Any]) -> Callable[..., Any]:
    """The `(session, payload)` handler the worker runs for a task: decode,
    call, encode (the same rules for the async and the thread form)."""
    func = made.func
    if inspect.iscoroutinefunction(func):
        async def run_async(session: Any, payload: dict[str, Any]) -> Any:
            return made.encode_result(await func(session, **made.decode_arguments(payload)))
        handler: Callable[..., Any] = run_async
    else:
        def run_sync(session: Any, payload: dict[str, Any]) -> Any:
            return made.encode_result(func(session, **made.decode_arguments(payload)))
        handler = run_sync
    handler.__name__ = handler.__qualname__ = getattr(func, "__qualname__", made.name)
    handler.__module__ = func.__module__
    return handler
