"""The HTTP API: enqueue and watch jobs from any service, and scrape metrics.

    jobqueue serve                          # 127.0.0.1:8000, DATABASE_URL or the embedded server

- `POST /jobs` `{job_type, payload, max_retries, run_at, queue, priority,
  unique_key, timeout}`: enqueue; 201 `{"id": …, "existed": false}`. With a unique key
  that an unfinished job already holds, nothing is written and the answer is
  200 `{"id": <that job>, "existed": true}` (Location: that job): the request
  did what it asked for (one such job exists), so it is no error, and a
  client that retries a timed-out POST gets the same id back.
- `GET /jobs/{id}`: the job (status, attempts, error history, result, times).
- `GET /jobs?status=&job_type=&queue=&limit=&before=`: newest first, one page
  at a time; the page's `next` is the `before` of the following one.
- `POST /jobs/{id}/retry`: a `failed` job runs again (pending, due now,
  retries renewed, error history kept); 409 for any other status, and 409
  when its unique key is now held by another unfinished job.
- `GET /queues`: each queue with jobs or settings: counts by status, running
  now, oldest due job's age, paused, limits.
- `POST /queues/{name}/pause`, `POST /queues/{name}/resume`: fleet-wide;
  `PUT /queues/{name}/limits` `{"concurrency": N|null, "rate": "20/s"|null}`
  (a field left out is kept; null removes the limit). Each answers with the
  queue's settings as they now are; a bad name or limit is a 422.
- `DELETE /jobs/{id}?reason=`: cancel a job (`jobqueue.control.cancel`). A
  waiting one ends `failed` (`cancelled`) at once: 200 with the job. One a
  worker has is asked to stop; the answer waits up to `cancel_wait` (2 s)
  for the outcome: 200 with the job if it ended (cancelled, or finished
  first), else 202 with the job as it stands and `"cancelling": true`. 409
  for a job that had finished already.
- `GET /metrics`: Prometheus' text format (see `jobqueue.ops.metrics`).
- `GET /openapi.json`: the schema (`create_app` only). There is no Swagger
  page: it loads its scripts from a third-party CDN, and a browser cannot
  send the bearer token a page needs; open the schema in a viewer of your
  own.

A malformed id is a 422, an unknown one a 404.

Input is checked by the same functions as `enqueue()` and `jobqueue enqueue`
(`check_job_type`, `encode_payload`, `check_max_retries`, `check_run_at`,
`check_timeout`, …), so
all three accept and refuse the same jobs, and nothing PostgreSQL would reject
reaches it: every mistake is a 4xx with a message, never a 500. The API cannot
know which job types a worker somewhere handles, so a job type is refused only
when it is invalid (not a string, empty, over 100 characters) — unless a
`registry` is given, then types it has no handler for are refused too.

Guards, on every route of the router:

- **Host names** (`origin.RouteHosts`): without a token, the routes answer
  to loopback names only, as `jobqueue serve` does, whatever middleware
  the app that mounts them has: a page whose name was made to resolve to
  127.0.0.1 (DNS rebinding) is a 400. `allowed_hosts=` names others;
  `auth=`, the app's own authentication, lets any name through, as a
  token does.
- **Bearer token**: if `JOBQUEUE_API_TOKEN` is set (or `token=` given),
  every request needs `Authorization: Bearer <token>` (401 otherwise,
  compared in constant time). It is checked before the body is read. In
  `create_app` that includes `/metrics` and `/openapi.json`: with a token,
  nothing answers without it (fetch the schema with
  `curl -H "Authorization: Bearer $JOBQUEUE_API_TOKEN" …/openapi.json`). A
  token shorter than 16 characters is refused when the app is made; a
  client that presents 10 wrong tokens in a minute gets 429s until the
  minute has passed (`jobqueue.ops.throttle`).
- **Body size**: at most `max_body_bytes` (1 MiB) per request body; a larger
  `Content-Length`, or a body that streams past the limit, is a 413 before
  any JSON is parsed.

In your own FastAPI app, either hand the router an engine:

    from jobqueue.api import create_router
    app.include_router(create_router(engine), prefix="/queue")

or include the module's `router` and tell it where the database is, with
`app.state.jobqueue_engine = engine` or a dependency of your own that yields
an `AsyncConnection` or `AsyncSession` with no transaction begun (the routes
begin and commit their own):

    from jobqueue import api
    app.include_router(api.router)
    app.dependency_overrides[api.get_connection] = my_session_dependency

`GET /jobs` pages by keyset (`before` = an opaque cursor of the id where the
last page ended; ids sort in the order jobs were made), not by offset: a
page deep in a large table costs what the first one does, and jobs enqueued
while someone pages never shift a page, so each job shows up exactly once.
A page looks at `PAGE_SCAN` jobs at most, so with a filter that matches few
it can be short, even empty, and still have a `next`.

Every read runs under a statement timeout (`read_timeout`, a 503 past it),
and `/queues` and `/metrics` share one reading of the table per second
(`jobqueue.ops.reads`).
"""

# No `from __future__ import annotations` here: FastAPI reads the routes'
# annotations, and some of them are local to create_router.

import base64
import binascii
import hmac
import json
import math
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request, Response, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticSerializationError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from jobqueue import __version__, control, db, queues
from jobqueue.enqueue import (
    MAX_RETRIES_LIMIT,
    check_job_type,
    check_max_retries,
    check_priority,
    check_queue,
    check_run_at,
    check_timeout,
    check_unique_key,
    encode_payload,
    try_enqueue,
)
from jobqueue.errors import (
    MIGRATE_HINT,
    is_connection_error,
    is_missing_schema,
    is_statement_timeout,
)
from jobqueue.ops import actions, bodies, held, metrics, routing
from jobqueue.ops.dashboard import create_dashboard
from jobqueue.ops.origin import ANY_HOST, HostGuard, RouteHosts, cross_origin
from jobqueue.ops.reads import (
    READ_TIMEOUT,
    TIMEOUT_HINT,
    Shared,
    bounded,
    forget_after_change,
)
from jobqueue.ops.throttle import Throttle, client_address
from jobqueue.ops.token import FROM_ENV, TOKEN_ENV, check, resolve
from jobqueue.registry import HandlerRegistry
from jobqueue.schema.models import (
    DEFAULT_QUEUE,
    JOB_TYPE_MAX_LENGTH,
    PRIORITY_MAX,
    PRIORITY_MIN,
    TIMEOUT_MAX,
    UNIQUE_KEY_MAX_LENGTH,
    JobStatus,
)
from jobqueue.schema.queries import queries

__all__ = ["DEFAULT_MAX_BODY_BYTES", "TOKEN_ENV", "create_app", "create_router",
           "get_connection", "router"]

#: Largest request body accepted, in bytes.
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
#: Most jobs one `GET /jobs` page holds.
PAGE_LIMIT = 500
#: Most jobs one `GET /jobs` page looks at (`queries.sql: api_list_jobs`):
#: with filters that match few, a page is bounded, not the table.
PAGE_SCAN = 10_000
#: Seconds one reading of `/metrics` and of `/queues` serves every client.
SHARED_TTL = 1.0
#: How long `DELETE /jobs/{id}` waits for a running job's worker to stop it.
DEFAULT_CANCEL_WAIT = 2.0

Executor = AsyncConnection | AsyncSession
_FROM_ENV = FROM_ENV  # `token` default: read JOBQUEUE_API_TOKEN at each request


# -- input and output -----------------------------------------------------------


def _check_text(value: str, what: str) -> str:
    """Text PostgreSQL can store: no NUL, no lone surrogate."""
    if "\x00" in value:
        raise ValueError(f"{what} must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} contains a lone surrogate, which is not valid Unicode") from None
    return value


class NewJob(BaseModel):
    """A job to enqueue."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"job_type": "send_email", "payload": {"to": "a@example.com"}, "max_retries": 3,
         "run_at": "2030-01-01T09:00:00+00:00", "queue": "emails", "priority": 5,
         "unique_key": "welcome:42", "timeout": 30}]})

    job_type: str = Field(max_length=JOB_TYPE_MAX_LENGTH,
                          description="which handler runs it; 1 to 100 characters")
    payload: dict[str, Any] = Field(default_factory=dict,
                                    description="a JSON object, at most 1,000,000 bytes")
    max_retries: int = Field(3, ge=0, le=MAX_RETRIES_LIMIT,
                             description="retries after the first attempt")
    run_at: datetime | None = Field(None, description="when it is due, ISO 8601 with a "
                                                      "time zone; default now")
    queue: str = Field(DEFAULT_QUEUE, description="the queue it goes to: 1 to 64 letters, "
                                                  "digits or _ . : -")
    priority: int = Field(0, ge=PRIORITY_MIN, le=PRIORITY_MAX,
                          description="higher runs first among its queue's due jobs")
    unique_key: str | None = Field(None, max_length=UNIQUE_KEY_MAX_LENGTH,
                                   description="while an unfinished job holds this key, "
                                               "no second one is made (200 with its id)")
    timeout: float | None = Field(None, gt=0, le=TIMEOUT_MAX,
                                  description="seconds one attempt may run before the worker "
                                              "stops it; default: its type's, if any")

    # Each check runs on the raw JSON value, before pydantic would coerce it
    # ("3" to 3): the same rules as enqueue() and the CLI, with their messages.
    @field_validator("job_type", mode="before")
    @classmethod
    def _job_type(cls, value: object) -> str:
        return _check_text(check_job_type(value), "job type")

    @field_validator("payload", mode="before")
    @classmethod
    def _payload(cls, value: object) -> object:
        try:
            encode_payload(value)
        except RecursionError:
            raise ValueError("payload is nested too deeply") from None
        return {} if value is None else value

    @field_validator("max_retries", mode="before")
    @classmethod
    def _max_retries(cls, value: object) -> int:
        return check_max_retries(value)

    @field_validator("queue", mode="before")
    @classmethod
    def _queue(cls, value: object) -> str:
        return check_queue(value)

    @field_validator("priority", mode="before")
    @classmethod
    def _priority(cls, value: object) -> int:
        return check_priority(value)

    @field_validator("unique_key", mode="before")
    @classmethod
    def _unique_key(cls, value: object) -> str | None:
        key = check_unique_key(value)
        return None if key is None else _check_text(key, "unique_key")

    @field_validator("timeout", mode="before")
    @classmethod
    def _timeout(cls, value: object) -> float | None:
        return check_timeout(value)

    @field_validator("run_at", mode="before")
    @classmethod
    def _run_at(cls, value: object) -> datetime | None:
        if value is None:
            return None
        if not isinstance(value, str):
            raise ValueError(f"run_at must be an ISO 8601 time string, not {value!r}")
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"run_at is not an ISO 8601 time: {value!r}") from None
        checked = check_run_at(parsed)
        try:
            checked.astimezone(UTC) if checked else None  # what the driver will do
        except OverflowError:
            raise ValueError(f"run_at is out of range: {value!r}") from None
        return checked


class Created(BaseModel):
    id: uuid.UUID
    existed: bool = Field(False, description="true: an unfinished job already held the "
                                             "unique key, and this is its id (status 200)")


class JobSummary(BaseModel):
    """A job as `GET /jobs` lists it (without payload, result and history)."""

    id: uuid.UUID
    job_type: str
    queue: str
    priority: int
    timeout: float | None = Field(description="seconds one attempt may run; null: none of "
                                              "its own")
    status: JobStatus
    attempts: int = Field(description="failed attempts recorded, plus a running or "
                                      "successful one")
    retry_count: int
    max_retries: int
    run_at: datetime
    next_retry_at: datetime | None
    error_message: str | None
    created_at: datetime
    started_at: datetime | None = Field(description="when its worker took it (a job in a "
                                                    "quick batch: when the batch began)")
    completed_at: datetime | None
    worker_id: int | None = Field(description="the worker that has it now, or had it last")


class Job(JobSummary):
    """Everything about one job."""

    unique_key: str | None
    payload: dict[str, Any]
    error_history: list[dict[str, Any]] = Field(
        description="every failed attempt: attempt number, error, time, and the "
                    "traceback when the handler raised")
    result: Any = None


class CancellingJob(Job):
    """A job whose worker was asked to stop it and had not yet, when answered."""

    cancelling: bool = Field(True, description="true: the worker running it was asked to "
                                               "stop it; ask for the job again to see the "
                                               "outcome")


class JobPage(BaseModel):
    jobs: list[JobSummary]
    next: str | None = Field(description="pass as `before` for the following page; "
                                         "null on the last page")


class Problem(BaseModel):
    detail: Any


class QueueSettings(BaseModel):
    """A queue's fleet-wide settings, as they are now."""

    queue: str
    paused: bool
    concurrency: int | None = Field(description="most of its jobs running at once, on all "
                                                "workers together; null: no limit")
    rate: str | None = Field(description="most of its jobs started per second, minute or "
                                         "hour (20/s, 100/m, 1000/h); null: no limit")


class QueueInfo(QueueSettings):
    """A queue: its settings, its jobs by status, how long its oldest due job waits."""

    counts: dict[JobStatus, int]
    running: int = Field(description="its jobs shown `processing` now")
    oldest_due_age_seconds: float | None = Field(
        description="how long its longest-waiting due job has been due; null: none")


class Unserved(BaseModel):
    """Due jobs of one queue and type that no live worker takes: none serves
    the queue with a handler for the type."""

    queue: str
    job_type: str
    count: int
    oldest_due_age_seconds: float | None


class QueueList(BaseModel):
    queues: list[QueueInfo]
    unserved: list[Unserved] = Field(description="due jobs no live worker takes, "
                                                 "longest-waiting first")
    estimated: list[JobStatus] = Field(
        default_factory=list,
        description="the statuses whose counts are estimates from PostgreSQL's statistics "
                    "(finished jobs, once there are too many to count at every reading); "
                    "the others are counted")


class Limits(BaseModel):
    """New limits for a queue: a field left out keeps its limit, null removes it."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"concurrency": 4, "rate": "20/s"}, {"rate": None}]})

    concurrency: int | None = Field(None, description="1 to 1,000,000; null: no limit")
    rate: str | None = Field(None, description="N/s, N/m or N/h; null: no limit")

    @field_validator("concurrency", mode="before")
    @classmethod
    def _concurrency(cls, value: object) -> int | None:
        return None if value is None else queues.check_concurrency(value)

    @field_validator("rate", mode="before")
    @classmethod
    def _rate(cls, value: object) -> str | None:
        return None if value is None else str(queues.parse_rate(value))


def _encode_cursor(job_id: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(str(job_id).encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> uuid.UUID:
    """The id a page ended at. (A cursor of the earlier `created_at|id` form
    still works: its id is where it ended.)"""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        return uuid.UUID(raw.rsplit("|", 1)[-1])
    except (ValueError, UnicodeDecodeError, binascii.Error):
        raise HTTPException(422, "before is not a cursor from a previous page's `next`") \
            from None


# -- guards: token, body size, errors ---------------------------------------------


def _problem(status: int, detail: Any, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


#: Most errors a 422 lists, and the longest name in a `loc` it shows.
ERRORS_SHOWN = 20
LOC_NAME_SHOWN = 40


def _validation_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    """Where and what, without echoing the input back (it may be a megabyte):
    no `input`, a message cut at 300 characters (ours quote at most 40 of a
    value, `errors.shown`; a library's might quote more), each name in
    `loc` cut at 40 (an unknown field is named by its key, which the client
    chose), and the first 20 errors (a body of 100,000 unknown keys is as
    many errors)."""
    errors = exc.errors()
    shown: list[dict[str, Any]] = [
        {"loc": [_cut(part) for part in e.get("loc", ())],
         "msg": str(e.get("msg", ""))[:300], "type": str(e.get("type", ""))}
        for e in errors[:ERRORS_SHOWN]]
    if len(errors) > ERRORS_SHOWN:
        shown.append({"loc": [], "msg": f"and {len(errors) - ERRORS_SHOWN:,} more errors",
                      "type": "more_errors"})
    return shown


def _cut(part: Any) -> Any:
    if isinstance(part, str) and len(part) > LOC_NAME_SHOWN:
        return f"{part[:LOC_NAME_SHOWN - 1]}…"
    return part


class _GuardedRoute(APIRoute):
    """Every route of the router: the Host name first (`RouteHosts`), then
    the token, then the body's size, then the handler; validation errors and
    leftover ValueErrors become 422s."""

    token: Any = _FROM_ENV
    hosts: RouteHosts = RouteHosts()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    throttle: Throttle
    read_timeout: float = READ_TIMEOUT
    #: Readings shared by clients, read afresh after a change made here.
    shared: tuple[Shared[Any], ...] = ()

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()
        token, hosts, limit, throttle = self.token, self.hosts, self.max_body_bytes, self.throttle
        read_timeout, shared = self.read_timeout, self.shared

        async def guarded(request: Request) -> Response:
            response = await answer(request)
            forget_after_change(request, response, shared)
            # JSON is never to be read as anything else (a browser sniffing
            # a payload of HTML would render it).
            response.headers["X-Content-Type-Options"] = "nosniff"
            return response

        async def answer(request: Request) -> Response:
            expected = resolve(token)
            wrong_host = hosts.refusal(request.scope, expected)
            if wrong_host is not None:
                return _problem(400, wrong_host)
            refused = _token_refusal(request, expected, throttle)
            if refused is not None:
                return refused
            if cross_origin(request):
                return _problem(403, "refused: a browser sent this on behalf of another site")
            body = await _read_body(request, limit)
            if isinstance(body, Response):
                return body
            try:
                return await handle(_with_body(request, body))
            except RequestValidationError as exc:
                return _problem(422, _validation_errors(exc))
            except PydanticSerializationError:
                raise  # a ValueError, but the server's own failure
            except ValueError as exc:  # a check that ran outside pydantic
                return _problem(422, str(exc))
            except Exception as exc:
                problem = _database_problem(exc, read_timeout)
                if problem is None:
                    raise
                return problem

        return guarded


def _database_problem(exc: Exception, read_timeout: float) -> Response | None:
    """A 503 saying what the database could not do (None: not its fault)."""
    if is_connection_error(exc):
        return _problem(503, "the database is unavailable; try again later")
    if is_missing_schema(exc):
        return _problem(503, MIGRATE_HINT)
    if is_statement_timeout(exc):
        return _problem(503, TIMEOUT_HINT.format(seconds=read_timeout))
    return None


def _token_refusal(request: Request, expected: str | None,
                   throttle: Throttle) -> Response | None:
    """A 401 for a missing or wrong token, a 429 for a client that sent too
    many wrong ones lately (whatever it sends now); None: go on."""
    if expected is None:
        return None
    client = client_address(request)
    wait = throttle.wait(client)
    if wait:
        return _problem(429, f"too many wrong tokens from {client}; try again in "
                             f"{math.ceil(wait)} s", {"Retry-After": str(math.ceil(wait))})
    if _authorized(request, expected):
        return None
    if "authorization" in request.headers:
        throttle.failed(client)
    return _problem(401, "missing or wrong bearer token (Authorization: Bearer …)",
                    {"WWW-Authenticate": "Bearer"})


def _authorized(request: Request, expected: str) -> bool:
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), expected.encode())


async def _read_body(request: Request, limit: int) -> bytes | Response:
    """The whole body, or a 413 as soon as it is known to be too large."""
    too_large = _problem(413, f"request body is larger than the limit of {limit:,} bytes")
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            return _problem(400, "Content-Length is not a number")
        if int(declared) > limit:
            return too_large
    try:
        return await bodies.read(request, limit)
    except bodies.TooLarge:
        return too_large
    except bodies.Gone:  # nobody reads this answer
        return _problem(400, "the client went away before sending its whole body")


def _with_body(request: Request, body: bytes) -> Request:
    """The request again, its body served from what was read."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return dict(await request.receive())  # later messages: http.disconnect

    return Request(request.scope, receive)


# -- the database -------------------------------------------------------------------


async def get_connection(request: Request) -> AsyncIterator[Executor]:
    """The module-level `router`'s database access: a connection from
    `app.state.jobqueue_engine`. Override it (`app.dependency_overrides`) to
    use your own engine or sessions."""
    engine: AsyncEngine | None = getattr(request.app.state, "jobqueue_engine", None)
    if engine is None:
        raise RuntimeError("jobqueue.api.router needs a database: set app.state.jobqueue_engine "
                           "or override jobqueue.api.get_connection")
    async with engine.connect() as conn:
        yield conn


def _engine_dependency(engine: AsyncEngine) -> Callable[[], AsyncIterator[Executor]]:
    async def connection() -> AsyncIterator[Executor]:
        async with engine.connect() as conn:
            yield conn

    return connection


_JSON_COLUMNS = ("payload", "error_history", "result")


async def _fetch_job(conn: Executor, job_id: uuid.UUID, status_code: int = 200,
                     **extra: Any) -> Response | None:
    """The job as a JSON response (with `extra` fields). Its JSON columns are
    spliced in as PostgreSQL wrote them: a payload nested too deeply for
    Python's (or pydantic's) recursion, which PostgreSQL stores fine, still
    reads back."""
    found = (await conn.execute(queries["api_get_job"].text, {"id": job_id})).mappings().first()
    if found is None:
        return None
    row = (await held.read(conn, [job_id])).shown(dict(found))
    scalars = {k: _jsonable(v) for k, v in row.items() if k not in _JSON_COLUMNS}
    head = json.dumps({**scalars, **extra}, ensure_ascii=False, separators=(",", ":"))
    raw = ",".join(f'"{k}":{"null" if row[k] is None else row[k]}' for k in _JSON_COLUMNS)
    return Response(f"{head[:-1]},{raw}}}", media_type="application/json",
                    status_code=status_code)


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


def _not_found(job_id: uuid.UUID) -> HTTPException:
    return HTTPException(404, f"no job {job_id}")


# -- the routes --------------------------------------------------------------------

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "missing or wrong bearer token"},
    413: {"model": Problem, "description": "request body too large"},
    422: {"model": Problem, "description": "invalid input; `detail` says what and where"},
}


def create_router(
    engine: AsyncEngine | None = None,
    *,
    registry: HandlerRegistry | None = None,
    token: str | None = _FROM_ENV,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    cancel_wait: float = DEFAULT_CANCEL_WAIT,
    dashboard: bool = True,
    throttle: Throttle | None = None,
    read_timeout: float = READ_TIMEOUT,
    allowed_hosts: Sequence[str] | None = None,
    auth: Callable[..., Any] | None = None,
) -> APIRouter:
    """The API's routes, for `app.include_router(...)`, and the dashboard's.

    engine: where the jobs are; None: `get_connection` (app.state, or your
        override). registry: if given, job types without a handler in it are
        refused. token: the bearer token; by default `JOBQUEUE_API_TOKEN`,
        read at each request; None: no token. max_body_bytes: request body limit.
    allowed_hosts: the Host names the routes answer to (names, `*.domain`,
        `ANY_HOST`); a request naming another is a 400 before anything runs.
        None: any name while a token or `auth` guards the routes, loopback
        names only while nothing does, as `jobqueue serve` (a page whose
        name was made to resolve to 127.0.0.1 is refused: DNS rebinding).
    auth: a dependency of your own that every route runs (what you would
        put in `Depends(...)`; raise an HTTPException to refuse). It must
        rest on something a browser does not send to every site by itself:
        a cookie of your domain, a header, not the client's address.
    cancel_wait: seconds `DELETE /jobs/{id}` waits for a running job to stop.
    dashboard: include the dashboard (`/` and `/dashboard/…`, see
        `jobqueue.ops.dashboard`), guarded by the same token.
    throttle: counts each client's wrong tokens, the API's and the
        dashboard login's together (`jobqueue.ops.throttle`); a new one
        by default.
    read_timeout: seconds each read (of the API and the dashboard) may run
        before the database stops it; the answer is then a 503.
    """
    if token is not _FROM_ENV:
        check(token)
    throttle = Throttle() if throttle is None else throttle
    queue_list, scrapes = _shared_readings()
    hosts = RouteHosts(allowed_hosts, own_auth=auth is not None)
    route_class = type("JobqueueRoute", (_GuardedRoute,),
                       {"token": token, "hosts": hosts, "max_body_bytes": max_body_bytes,
                        "throttle": throttle, "read_timeout": read_timeout,
                        "shared": (queue_list, scrapes)})
    connection = get_connection if engine is None else _engine_dependency(engine)
    Conn = Annotated[Executor, Depends(connection)]  # noqa: N806 - a type alias
    r = APIRouter(route_class=route_class, responses=_ERRORS,
                  dependencies=_router_dependencies(auth))

    @r.post("/jobs", status_code=201, response_model=Created, name="jobqueue_create_job",
            summary="Enqueue a job", tags=["jobs"])
    async def create_job(new: NewJob, request: Request, response: Response,
                         conn: Conn) -> Created:
        if registry is not None and new.job_type not in registry:
            raise HTTPException(422, f"no handler is registered for job type {new.job_type!r}")
        async with conn.begin():
            job = await try_enqueue(conn, new.job_type, new.payload,
                                    max_retries=new.max_retries, run_at=new.run_at,
                                    queue=new.queue, priority=new.priority,
                                    unique_key=new.unique_key, timeout=new.timeout)
        response.headers["Location"] = str(request.url_for("jobqueue_get_job", job_id=job.id))
        if not job.created:
            response.status_code = 200
        return Created(id=job.id, existed=not job.created)

    @r.get("/jobs/{job_id}", response_model=Job, name="jobqueue_get_job",
           summary="One job: status, attempts, error history, result, timestamps",
           responses={404: {"model": Problem}}, tags=["jobs"])
    async def get_job(job_id: uuid.UUID, conn: Conn) -> Response:
        async with bounded(conn, read_timeout):
            job = await _fetch_job(conn, job_id)
        if job is None:
            raise _not_found(job_id)
        return job

    @r.get("/jobs", response_model=JobPage, name="jobqueue_list_jobs",
           summary="Jobs, newest first, one page at a time", tags=["jobs"])
    async def list_jobs(
        conn: Conn,
        status: Annotated[JobStatus | None, Query(description="only jobs in this state")] = None,
        job_type: Annotated[str | None, Query(description="only jobs of this type")] = None,
        queue: Annotated[str | None, Query(description="only jobs of this queue")] = None,
        limit: Annotated[int, Query(ge=1, le=PAGE_LIMIT, description="jobs per page")] = 50,
        before: Annotated[str | None, Query(description="`next` of the previous page")] = None,
    ) -> JSONResponse:
        async with bounded(conn, read_timeout):
            page = await _page(conn, status, job_type, queue, limit, before)
        return JSONResponse(page)

    @r.post("/jobs/{job_id}/retry", response_model=Job, name="jobqueue_retry_job",
            summary="Run a failed job again",
            description="Only a `failed` job: it becomes `pending`, due now, with its "
                        "retries renewed (`retry_count` 0) and its error history kept. "
                        "409 if it is not failed, or if another unfinished job now holds "
                        "its unique key.",
            responses={404: {"model": Problem}, 409: {"model": Problem}}, tags=["jobs"])
    async def retry_job(job_id: uuid.UUID, conn: Conn) -> Response:
        return await _retry(conn, job_id, read_timeout)

    @r.delete("/jobs/{job_id}", response_model=Job, name="jobqueue_cancel_job",
              summary="Cancel a job: at once if it waits, else ask its worker to stop it",
              description="A `pending` or `retrying` job that no worker holds ends `failed` "
                          "at once with error_message `cancelled` (`cancelled: <reason>`), "
                          "and no attempt is added to its error history: 200. A job a "
                          "worker has (running, or locked in a quick batch) is asked to "
                          f"stop, and the answer waits up to {cancel_wait:g} s: 200 with "
                          "the job if it ended by then (cancelled, or finished first), "
                          "else 202 with the job as it stands and `cancelling: true`. The "
                          "worker records `cancelled` without the reason. 409: the job "
                          "had finished already.",
              responses={202: {"model": CancellingJob}, 404: {"model": Problem},
                         409: {"model": Problem}}, tags=["jobs"])
    async def cancel_job(
        job_id: uuid.UUID,
        conn: Conn,
        reason: Annotated[str | None, Query(
            max_length=control.REASON_MAX_LENGTH, description="kept in error_message")] = None,
    ) -> Response:
        return await _cancel(conn, job_id, reason, cancel_wait, read_timeout)

    _add_queue_routes(r, Conn, queue_list, read_timeout)
    if dashboard:
        r.include_router(create_dashboard(connection, token=token, hosts=hosts,
                                          cancel_wait=cancel_wait, throttle=throttle,
                                          read_timeout=read_timeout, routes=queue_list))

    @r.get("/metrics", name="jobqueue_metrics", summary="Prometheus metrics",
           response_class=Response, tags=["observability"],
           responses={200: {"content": {metrics.CONTENT_TYPE_LATEST: {}}}})
    async def scrape(conn: Conn) -> Response:
        async with bounded(conn, read_timeout):
            body = await scrapes.get(conn)
        return Response(body, media_type=metrics.CONTENT_TYPE_LATEST)

    return r


def _router_dependencies(auth: Callable[..., Any] | None) -> list[Any]:
    """The bearer scheme, declared for the OpenAPI schema (the check is the
    route's), and the app's own authentication if it gave one."""
    dependencies: list[Any] = [Security(HTTPBearer(auto_error=False))]
    if auth is not None:
        dependencies.append(Depends(auth))
    return dependencies


def _shared_readings() -> tuple[Shared[routing.Routing], Shared[bytes]]:
    """The pass over the whole table behind `GET /queues`, `GET /metrics`
    and the dashboard's overview, made once a second at most however many
    clients ask, and the metrics' text, rendered once for all of them. The
    caller holds a `bounded` transaction."""
    routes = Shared(routing.read, SHARED_TTL)

    async def read_metrics(conn: Executor) -> bytes:
        return metrics.exposition(await metrics.snapshot(conn, routes=await routes.get(conn)))

    return routes, Shared(read_metrics, SHARED_TTL)


def _add_queue_routes(r: APIRouter, Conn: Any,  # noqa: N803 - a type alias
                      queue_list: Shared[routing.Routing], read_timeout: float) -> None:
    """`GET /queues` and the routes that change a queue's settings."""

    @r.get("/queues", response_model=QueueList, name="jobqueue_list_queues",
           summary="Queues: jobs by status, running now, oldest due, paused, limits",
           description="Each queue that has jobs or settings, by name, and the due jobs "
                       "that no live worker takes (no worker serves their queue with a "
                       "handler for their type), which is why they wait.", tags=["queues"])
    async def list_queues(conn: Conn) -> dict[str, Any]:
        async with bounded(conn, read_timeout):
            routes = await queue_list.get(conn)
        return {"queues": routes.queues(), "unserved": routes.unserved(),
                "estimated": list(routes.estimated)}

    @r.post("/queues/{name}/pause", response_model=QueueSettings, name="jobqueue_pause_queue",
            summary="Pause a queue on every worker",
            description="No worker starts a job of the queue until it is resumed; jobs "
                        "already running finish.", tags=["queues"])
    async def pause_queue(name: str, conn: Conn) -> QueueSettings:
        return await _change_queue(conn, name, queues.pause)

    @r.post("/queues/{name}/resume", response_model=QueueSettings,
            name="jobqueue_resume_queue", summary="Resume a paused queue", tags=["queues"])
    async def resume_queue(name: str, conn: Conn) -> QueueSettings:
        return await _change_queue(conn, name, queues.resume)

    @r.put("/queues/{name}/limits", response_model=QueueSettings,
           name="jobqueue_limit_queue", summary="Set or remove a queue's fleet-wide limits",
           description="`concurrency`: most of its jobs running at once on all workers "
                       "together; `rate`: most started per second, minute or hour. A "
                       "field left out keeps its limit, null removes it. A limit applies "
                       "to claims that start after it is set.", tags=["queues"])
    async def limit_queue(name: str, limits: Limits, conn: Conn) -> QueueSettings:
        given = {k: getattr(limits, k) for k in limits.model_fields_set}
        if not given:
            raise HTTPException(422, "give concurrency, rate or both (null removes a limit)")
        return await _change_queue(conn, name, lambda c, q: queues.limit(c, q, **given))


async def _page(conn: Executor, status: JobStatus | None, job_type: str | None,
                queue: str | None, limit: int, before: str | None) -> dict[str, Any]:
    """A `JobPage`, JSON-ready (times as `get_job` gives them)."""
    if job_type is not None:
        _check_text(check_job_type(job_type), "job_type")
    if queue is not None:
        check_queue(queue)
    cursor = None if before is None else _decode_cursor(before)
    window = {"before_id": cursor, "scan": max(PAGE_SCAN, limit + 1)}
    result = await conn.execute(queries["api_list_jobs"].text, {
        **window, "status": None if status is None else status.value, "job_type": job_type,
        "queue": queue, "limit": limit + 1})
    rows = [dict(r) for r in result.mappings()]
    # A short page ends where its look ended (None: at the oldest job).
    scanned_to = None if len(rows) > limit else \
        (await conn.execute(queries["api_list_scanned"].text, window)).scalar()
    holding = await held.read(conn)
    if status is not None and status.value == held.RUNNING:  # the table says waiting
        running = [r for r in holding.running(queue=queue, job_type=job_type)
                   if scanned_to is None or r["id"] > scanned_to]
        rows = held.merged(rows, running, key="id",
                           before=None if cursor is None else (cursor, cursor), limit=limit + 1)
    more = len(rows) > limit  # one row past the page says whether another follows
    page = [holding.shown(row) for row in rows[:limit]]
    if status is not None:  # a held job a waiting status found is running
        page = [row for row in page if row["status"] == status.value]
    end = rows[limit - 1]["id"] if more else scanned_to
    return {"jobs": [{k: _jsonable(row[k]) for k in JobSummary.model_fields} for row in page],
            "next": None if end is None else _encode_cursor(end)}


async def _cancel(conn: Executor, job_id: uuid.UUID, reason: str | None,
                  cancel_wait: float, read_timeout: float) -> Response:
    """`DELETE /jobs/{id}`: cancel, and if a worker has the job, wait a
    little for it to end (the answer says whether it did)."""
    try:
        ended = await actions.cancel(conn, job_id, reason, cancel_wait)
    except actions.NotFound as exc:
        raise HTTPException(404, str(exc)) from None
    except actions.Conflict as exc:
        raise HTTPException(409, str(exc)) from None
    status_code, extra = (200, {}) if ended else (202, {"cancelling": True})
    async with bounded(conn, read_timeout):
        job = await _fetch_job(conn, job_id, status_code, **extra)
    if job is None:  # deleted meanwhile
        raise _not_found(job_id)
    return job


async def _retry(conn: Executor, job_id: uuid.UUID, read_timeout: float) -> Response:
    """`POST /jobs/{id}/retry`: 404 for no such job, 409 for one that is not
    failed or whose unique key another unfinished job now holds."""
    try:
        await actions.retry(conn, job_id)
    except actions.NotFound as exc:
        raise HTTPException(404, str(exc)) from None
    except actions.Conflict as exc:
        raise HTTPException(409, str(exc)) from None
    async with bounded(conn, read_timeout):
        job = await _fetch_job(conn, job_id)
    if job is None:  # deleted meanwhile
        raise _not_found(job_id)
    return job


async def _change_queue(conn: Executor, name: str,
                        change: Callable[[Executor, str], Awaitable[None]]) -> QueueSettings:
    """Apply `change` (pause, resume, limits) and answer with the settings it left."""
    settings = await actions.change_queue(conn, name, change)
    return QueueSettings(queue=name, **routing.settings_dict(settings))


#: The routes for an app of your own; see the module's docstring.
router = create_router()


# -- the application ---------------------------------------------------------------


def create_app(
    database_url: str | None = None,
    *,
    registry: HandlerRegistry | None = None,
    token: str | None = _FROM_ENV,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    cancel_wait: float = DEFAULT_CANCEL_WAIT,
    allowed_hosts: Sequence[str] | None = None,
    throttle: Throttle | None = None,
    read_timeout: float = READ_TIMEOUT,
) -> FastAPI:
    """The API as an application (what `jobqueue serve` runs).

    database_url: DATABASE_URL when None (`jobqueue serve` starts the embedded
        PostgreSQL first when that is unset; the app itself never does).
    token: by default `JOBQUEUE_API_TOKEN` as set now; None: no token.
    allowed_hosts: the Host names it answers to (`origin.HostGuard`: names,
        `*.domain`, `*`). None: loopback names without a token, any with one.
        A page on a name rebound to 127.0.0.1 is refused (DNS rebinding).
    throttle, read_timeout: as `create_router`'s.
    A token shorter than `token.MIN_LENGTH` is a ValueError.
    """
    if token is _FROM_ENV:
        token = os.environ.get(TOKEN_ENV) or None
    check(token)
    throttle = Throttle() if throttle is None else throttle
    engine = db.create_engine(database_url)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await engine.dispose()

    app = FastAPI(title="jobqueue", version=__version__, lifespan=lifespan,
                  description="Enqueue and watch jobs of a PostgreSQL job queue.",
                  openapi_url=None, docs_url=None, redoc_url=None)
    app.state.jobqueue_engine = engine
    app.include_router(create_router(engine, registry=registry, token=token,
                                     max_body_bytes=max_body_bytes, cancel_wait=cancel_wait,
                                     throttle=throttle, read_timeout=read_timeout,
                                     allowed_hosts=allowed_hosts))
    app.include_router(_docs_router(app, token, max_body_bytes, throttle, allowed_hosts))
    # The middleware answers first, on every path (those no route has too);
    # the routes' own check, the same rule, is what travels with the router.
    if allowed_hosts is None and token is not None:
        allowed_hosts = [ANY_HOST]
    app.add_middleware(HostGuard, allowed=allowed_hosts)
    return app


def _docs_router(app: FastAPI, token: str | None, max_body_bytes: int,
                 throttle: Throttle, allowed_hosts: Sequence[str] | None) -> APIRouter:
    """/openapi.json behind the same guards as the API."""
    route_class = type("JobqueueDocsRoute", (_GuardedRoute,),
                       {"token": token, "hosts": RouteHosts(allowed_hosts),
                        "max_body_bytes": max_body_bytes, "throttle": throttle})
    docs = APIRouter(route_class=route_class, include_in_schema=False)

    @docs.get("/openapi.json")
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    return docs
