"""The dashboard's routes: pages rendered on the server, one small script.

Every page is HTML rendered by Jinja with autoescaping on, so whatever a job
carries (its type, payload, errors, result) reaches the browser as text.
The overview's live part is a fragment of that same HTML that the script
fetches every few seconds and swaps in: one way to render, no client-side
templating. Responses forbid inline scripts and anything not served from
here (Content-Security-Policy), a second wall behind the escaping.

A guard runs before every route (`_DashboardRoute`): a Host name it
answers to (`origin.RouteHosts`, the API's rule); with a token, a valid
session or a redirect to the login form; for anything that changes
something, a same-origin browser and the form's CSRF token; a small body.
"""

# No `from __future__ import annotations`: FastAPI reads the routes'
# annotations, and `Conn` is local to create_dashboard.

import math
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import UTC, datetime
from importlib import resources
from typing import Annotated, Any
from urllib.parse import parse_qsl, urlencode

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.routing import APIRoute
from jinja2 import Environment, PackageLoader, select_autoescape
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from jobqueue import __version__, queues
from jobqueue.enqueue import check_job_type, check_queue
from jobqueue.errors import (
    MIGRATE_HINT,
    is_connection_error,
    is_missing_schema,
    is_statement_timeout,
    shown,
)
from jobqueue.ops import actions, bodies, horizon
from jobqueue.ops.dashboard import auth, charts, overview, pages
from jobqueue.ops.origin import SAFE_METHODS, RouteHosts, cross_origin
from jobqueue.ops.reads import (
    READ_TIMEOUT,
    TIMEOUT_HINT,
    Shared,
    bounded,
    forget_after_change,
)
from jobqueue.ops.routing import Routing
from jobqueue.ops.throttle import Throttle, client_address
from jobqueue.ops.token import FROM_ENV, resolve

__all__ = ["create_dashboard"]

Executor = AsyncConnection | AsyncSession
ConnectionDependency = Callable[..., AsyncIterator[Executor]]

#: Largest form body accepted (a login or an action is a few hundred bytes).
MAX_FORM_BYTES = 16 * 1024
#: Seconds between the overview's refreshes in the browser.
REFRESH_SECONDS = 2.0
STATIC_FILES = {"dashboard.css": "text/css", "dashboard.js": "text/javascript",
                "favicon.svg": "image/svg+xml"}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self'; connect-src 'self'; form-action 'self'; "
                               "base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
}
#: What an action reports on the page it returns to (`?done=`): fixed sentences,
#: so nothing from the query string is ever shown.
DONE = {
    "retried": "The job will run again: it is pending, due now.",
    "cancelled": "The job is cancelled.",
    "cancelling": "Its worker was asked to stop the job; the page shows when it has.",
    "paused": "The queue is paused on every worker.",
    "resumed": "The queue runs again on every worker.",
}

_templates = Environment(loader=PackageLoader("jobqueue.ops.dashboard", "templates"),
                         autoescape=select_autoescape(default=True, default_for_string=True),
                         trim_blocks=True, lstrip_blocks=True)


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    s = max(float(seconds), 0.0)
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.0f} d"


def _when(value: datetime | float | str | None) -> str:
    """A time in UTC to the millisecond; an error history's ISO text too."""
    if value is None:
        return "—"
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return str(value)
    elif not isinstance(value, datetime):
        value = datetime.fromtimestamp(float(value), UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _number(value: float | int | None) -> str:
    if value is None:
        return "—"
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.1f}"


_templates.filters.update(ago=_ago, when=_when, number=_number)
_templates.globals.update(
    describe=horizon.describe,
    estimate_note=("Estimated from PostgreSQL's statistics: too many finished jobs to count "
                   "at every refresh"))



class _Refused(Exception):
    """Answer with a page saying this, and this status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _LogIn(Exception):
    """Answer a page's GET with the login form."""


class _DashboardRoute(APIRoute):
    """Every dashboard route: security headers on the answer, and a page
    saying what went wrong for a refusal or a database that cannot answer.
    The checks themselves are dependencies (`_guard`, `_open_guard`), so a
    session is looked up on the connection the page then uses."""

    token: Any = FROM_ENV
    hosts: RouteHosts = RouteHosts()
    read_timeout: float = READ_TIMEOUT
    #: What to read afresh after a change made from a page (the overview).
    readings: tuple[overview.Overview, ...] = ()

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()
        token_setting, hosts = self.token, self.hosts
        read_timeout, readings = self.read_timeout, self.readings

        async def guarded(request: Request) -> Response:
            request.scope["jobqueue_dashboard_root"] = request.url_for("jobqueue_dashboard").path
            request.state.token = resolve(token_setting)
            wrong_host = hosts.refusal(request.scope, request.state.token)
            if wrong_host is not None:  # before anything runs, and with no cookie set
                return Response(wrong_host, 400, SECURITY_HEADERS, media_type="text/plain")
            request.state.read_timeout = read_timeout
            request.state.logged_in = False
            request.state.form = {}
            try:
                response = await handle(request)
            except _LogIn:
                response = RedirectResponse(request.url_for("jobqueue_dashboard_login").path, 303)
            except _Refused as refused:
                response = _message_page(request, refused.status, str(refused))
            except Exception as exc:
                if is_missing_schema(exc):
                    response = _message_page(request, 503, MIGRATE_HINT.capitalize() + ".")
                elif is_connection_error(exc):
                    response = _message_page(request, 503, "The database is unavailable; this "
                                                           "page will work again once it is "
                                                           "back.")
                elif is_statement_timeout(exc):
                    response = _message_page(request, 503, TIMEOUT_HINT.format(
                        seconds=read_timeout).capitalize() + ".")
                else:
                    raise
            forget_after_change(request, response, readings)
            response.headers.update(SECURITY_HEADERS)
            return response

        return guarded


def _guards(Conn: Any) -> tuple[Callable[..., Any], Callable[..., Any]]:  # noqa: N803
    """The dependencies that guard the pages (`guard`: with a token, an open
    session) and the login, logout and static files (`open_guard`); both
    ask a change for a same-origin browser, a small form and its CSRF token.
    The checked form fields are left in `request.state.form`."""

    async def open_guard(request: Request) -> None:
        if request.method not in SAFE_METHODS:
            if cross_origin(request):
                raise _Refused(403, "Refused: this request came from another site.")
            request.state.form = await _read_form(request)
            if not auth.csrf_ok(request, request.state.form):
                raise _Refused(403, "Refused: the form's security token is missing or stale; "
                                    "reload the page and try again.")

    async def guard(request: Request, conn: Conn) -> None:
        token = request.state.token
        if token is not None:
            request.state.logged_in = await auth.session_valid(request, conn, token)
            if not request.state.logged_in:
                if request.method in SAFE_METHODS:
                    raise _LogIn
                raise _Refused(401, "Log in first: this dashboard needs the API token.")
        await open_guard(request)

    return guard, open_guard


async def _read_form(request: Request) -> dict[str, str]:
    """A small urlencoded form (the dashboard posts nothing else)."""
    if request.headers.get("content-type", "").split(";")[0].strip() \
            != "application/x-www-form-urlencoded":
        return {}  # no form: no CSRF token either, refused as such
    try:
        body = await bodies.read(request, MAX_FORM_BYTES)
    except bodies.TooLarge:
        raise _Refused(413, "That form is too large.") from None
    except bodies.Gone:  # nobody reads this answer
        raise _Refused(400, "The form was not sent whole.") from None
    try:
        return dict(parse_qsl(body.decode(), keep_blank_values=True, max_num_fields=20))
    except (UnicodeDecodeError, ValueError):
        raise _Refused(400, "That form could not be read.") from None


# -- rendering -------------------------------------------------------------------


def _render(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
    csrf, new = auth.csrf_token(request)
    html = _templates.get_template(name).render(
        request=request, url=lambda route, **path: request.url_for(route, **path).path,
        csrf=csrf, csrf_field=auth.CSRF_FIELD,
        version=__version__, logged_in=getattr(request.state, "logged_in", False),
        refresh_ms=int(REFRESH_SECONDS * 1000), **context)
    response = HTMLResponse(html, status_code=status)
    if new:
        auth.set_csrf_cookie(request, response, csrf)
    return response


def _message_page(request: Request, status: int, message: str) -> HTMLResponse:
    return _render(request, "message.html", status, title="jobqueue", message=message)


def _charts(snapshot: overview.Snapshot) -> list[charts.Chart]:
    series, width = snapshot.series, snapshot.width
    every = max(1, round(120 / width))  # a label every two minutes
    labels = [(i, f"−{(len(series) - i) * width / 60:g} min")
              for i in range(0, len(series), every)]
    Values = dict[str, tuple[str, list[float | None]]]  # noqa: N806 - a type alias
    per_second: Values = {"completed": ("completed", [b.completed / width for b in series]),
                          "failed": ("failed", [b.failed / width for b in series])}
    latency: Values = {"p50": ("p50", [None if b.p50 is None else b.p50 * 1000 for b in series]),
               "p99": ("p99", [None if b.p99 is None else b.p99 * 1000 for b in series])}
    return [charts.line_chart("Jobs finished per second", "jobs/s", per_second, labels),
            charts.line_chart("Due → completion (ms)", "ms", latency, labels, marks=True)]


def _redirect(request: Request, route: str, done: str, **path: Any) -> RedirectResponse:
    return RedirectResponse(f"{request.url_for(route, **path).path}?{urlencode({'done': done})}",
                            303)


def _done(request: Request) -> str | None:
    return DONE.get(request.query_params.get("done", ""))


def _job_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise _Refused(404, "No such job: that is not a job id.") from None


def _filters(request: Request) -> dict[str, Any]:
    """The job list's filters from the query string; a bad one is a 400 page
    that quotes 40 characters of it at most (escaped, as all text is)."""
    q = request.query_params
    tab = q.get("status") or "waiting"
    if tab not in pages.TABS:
        raise _Refused(400, f"There is no list of {shown(tab)} jobs; the lists are "
                            + ", ".join(pages.TABS) + ".")
    try:
        queue = check_queue(q["queue"]) if q.get("queue") else None
        job_type = check_job_type(q["type"]) if q.get("type") else None
        before = _before(q.get("before") or None)
    except ValueError as exc:
        raise _Refused(400, str(exc)) from None
    return {"tab": tab, "queue": queue, "job_type": job_type, "before": before,
            "cursor": q.get("after") or None}


def _before(text: str | None) -> datetime | None:
    """`before` from the form's datetime-local field (UTC) or ISO 8601."""
    if text is None:
        return None
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"'before' is not a time: {shown(text)}") from None
    return pages.in_range(at.replace(tzinfo=UTC) if at.tzinfo is None else at)


# -- the routes ----------------------------------------------------------------------

#: Seconds one reading of the overview serves every viewer (and its live refresh).
OVERVIEW_TTL = 1.5


def create_dashboard(connection: ConnectionDependency, *, token: Any = FROM_ENV,
                     hosts: RouteHosts | None = None,
                     cancel_wait: float = 2.0, overview_ttl: float = OVERVIEW_TTL,
                     throttle: Throttle | None = None,
                     read_timeout: float = READ_TIMEOUT,
                     routes: Shared[Routing] | None = None) -> APIRouter:
    """The dashboard's routes: `/` and `/dashboard/…` of the router they join.

    connection: the dependency that yields a connection (the API's). token:
    as `create_router`'s. hosts: the Host names it answers to (None: loopback
    names without a token, any with one). cancel_wait: seconds a cancel
    waits for a running job's worker. overview_ttl: how stale the overview's
    shared reading may be.
    throttle: counts each client's wrong tokens (`jobqueue.ops.throttle`).
    read_timeout: seconds each page's reads may run (`jobqueue.ops.reads`).
    routes: the pass over the table that `/queues` and `/metrics` share, to
    share it with the overview too (None: the overview's own).
    """
    seen = overview.Overview(ttl=overview_ttl, timeout=read_timeout, routes=routes)
    route = type("JobqueueDashboardRoute", (_DashboardRoute,),
                 {"token": token, "hosts": RouteHosts() if hosts is None else hosts,
                  "read_timeout": read_timeout, "readings": (seen,)})
    Conn = Annotated[Executor, Depends(connection)]  # noqa: N806 - a type alias
    guard, open_guard = _guards(Conn)
    r = APIRouter(route_class=route, include_in_schema=False, dependencies=[Depends(guard)])
    # Its own router, not included in `r`: that would add `guard` to its routes.
    open_r = APIRouter(route_class=route, include_in_schema=False,
                       dependencies=[Depends(open_guard)])

    @r.get("/", name="jobqueue_dashboard")
    async def home(request: Request, conn: Conn) -> Response:
        return _render(request, "overview.html", title="Overview", done=_done(request),
                       snap=await seen.get(conn), charts_of=_charts)

    @r.get("/dashboard/overview", name="jobqueue_dashboard_live")
    async def live(request: Request, conn: Conn) -> Response:
        """The overview's live part, which the page swaps in as it is."""
        return _render(request, "overview_live.html", snap=await seen.get(conn),
                       charts_of=_charts)

    @r.get("/dashboard/jobs", name="jobqueue_dashboard_jobs")
    async def jobs(request: Request, conn: Conn) -> Response:
        f = _filters(request)
        try:
            async with bounded(conn, request.state.read_timeout):
                page = await pages.list_jobs(conn, f["tab"], queue=f["queue"],
                                             job_type=f["job_type"], before=f["before"],
                                             cursor=f["cursor"])
        except ValueError as exc:
            raise _Refused(400, str(exc)) from None
        keep = {k: v for k, v in (("status", f["tab"]), ("queue", f["queue"]),
                                  ("type", f["job_type"]),
                                  ("before", request.query_params.get("before")))
                if v}
        return _render(request, "jobs.html", title="Jobs", f=f, page=page, tabs=pages.TABS,
                       next_query=None if page.next is None
                       else urlencode({**keep, "after": page.next}),
                       first_query=urlencode(keep))

    @r.get("/dashboard/jobs/{job_id}", name="jobqueue_dashboard_job")
    async def job_page(request: Request, job_id: str, conn: Conn) -> Response:
        return await _job(request, conn, _job_id(job_id), done=_done(request))

    _add_actions(r, Conn, cancel_wait)
    _add_login(open_r, Conn, Throttle() if throttle is None else throttle)
    both = APIRouter(include_in_schema=False)
    both.include_router(r)
    both.include_router(open_r)
    return both


def _add_actions(r: APIRouter, Conn: Any, cancel_wait: float) -> None:  # noqa: N803
    """Retry, cancel, pause, resume: each answers with the page it came
    from, saying what happened (or why nothing did)."""

    @r.post("/dashboard/jobs/{job_id}/retry", name="jobqueue_dashboard_retry")
    async def retry(request: Request, job_id: str, conn: Conn) -> Response:
        found = _job_id(job_id)
        try:
            await actions.retry(conn, found)
        except (actions.NotFound, actions.Conflict) as exc:
            return await _job(request, conn, found, error=str(exc), status=409)
        return _redirect(request, "jobqueue_dashboard_job", "retried", job_id=str(found))

    @r.post("/dashboard/jobs/{job_id}/cancel", name="jobqueue_dashboard_cancel")
    async def cancel(request: Request, job_id: str, conn: Conn) -> Response:
        found = _job_id(job_id)
        reason = request.state.form.get("reason", "").strip() or None
        try:
            ended = await actions.cancel(conn, found, reason, cancel_wait)
        except (actions.NotFound, actions.Conflict, ValueError) as exc:
            return await _job(request, conn, found, error=str(exc), status=409)
        return _redirect(request, "jobqueue_dashboard_job",
                         "cancelled" if ended else "cancelling", job_id=str(found))

    @r.post("/dashboard/queues/{name}/pause", name="jobqueue_dashboard_pause")
    async def pause(request: Request, name: str, conn: Conn) -> Response:
        return await _queue_action(request, conn, name, queues.pause, "paused")

    @r.post("/dashboard/queues/{name}/resume", name="jobqueue_dashboard_resume")
    async def resume(request: Request, name: str, conn: Conn) -> Response:
        return await _queue_action(request, conn, name, queues.resume, "resumed")


def _add_login(open_r: APIRouter, Conn: Any, throttle: Throttle) -> None:  # noqa: N803
    """The login form, logout, the stylesheet and the script: no session needed."""

    @open_r.get("/dashboard/login", name="jobqueue_dashboard_login")
    async def login_form(request: Request) -> Response:
        if request.state.token is None:
            return RedirectResponse(request.url_for("jobqueue_dashboard").path, 303)
        return _render(request, "login.html", title="Log in")

    @open_r.post("/dashboard/login", name="jobqueue_dashboard_login_post")
    async def login(request: Request, conn: Conn) -> Response:
        token = request.state.token
        if token is None:
            return RedirectResponse(request.url_for("jobqueue_dashboard").path, 303)
        client = client_address(request)
        wait = throttle.wait(client)
        if wait:
            return _render(request, "login.html", 429, title="Log in",
                           error=f"Too many wrong tokens from this address: try again in "
                                 f"{math.ceil(wait)} s.")
        if not auth.token_matches(request.state.form.get("token", ""), token):
            throttle.failed(client)
            return _render(request, "login.html", 401, title="Log in",
                           error="That is not the token.")
        response = RedirectResponse(request.url_for("jobqueue_dashboard").path, 303)
        await auth.start_session(request, response, conn, token)
        return response

    @open_r.post("/dashboard/logout", name="jobqueue_dashboard_logout")
    async def logout(request: Request, conn: Conn) -> Response:
        response = RedirectResponse(request.url_for("jobqueue_dashboard_login").path, 303)
        await auth.end_session(request, response, conn, request.state.token)
        return response

    @open_r.get("/dashboard/static/{name}", name="jobqueue_dashboard_static")
    async def static(name: str) -> Response:
        if name not in STATIC_FILES:
            raise _Refused(404, "No such file.")
        body = resources.files("jobqueue.ops.dashboard").joinpath("static", name).read_bytes()
        return Response(body, media_type=STATIC_FILES[name],
                        headers={"Cache-Control": "no-cache"})


async def _job(request: Request, conn: Executor, job_id: uuid.UUID, *, done: str | None = None,
               error: str | None = None, status: int = 200) -> Response:
    async with bounded(conn, request.state.read_timeout):
        found = await pages.job(conn, job_id)
    if found is None:
        raise _Refused(404, f"No job {job_id}.")
    return _render(request, "job.html", status, title=f"Job {job_id}", job=found, done=done,
                   error=error, pretty=pages.pretty_json,
                   can_retry=found["status"] == "failed",
                   can_cancel=found["status"] in ("pending", "retrying", "processing"))


async def _queue_action(request: Request, conn: Executor, name: str,
                        change: Callable[[Executor, str], Coroutine[Any, Any, None]],
                        done: str) -> Response:
    try:
        await actions.change_queue(conn, name, change)
    except ValueError as exc:
        raise _Refused(400, str(exc)) from None
    return _redirect(request, "jobqueue_dashboard", done)
