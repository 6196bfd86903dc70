"""The dashboard over HTTP, in process, against the real database: what each
page shows, its guards (token, CSRF, other origins), its actions, and its
pages walked to the end. What a browser does with it: tests/browser/."""

from __future__ import annotations

import base64
import json
import re
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from jobqueue import enqueue, enqueue_many
from jobqueue.api import create_router
from jobqueue.ops.dashboard import auth
from jobqueue.testing import wait_for
from tests.conftest import client_for

TOKEN = "dashboard-s3cret"
HOSTILE = {
    "script": "<script>alert('payload')</script>",
    "attribute": '"><img src=x onerror=alert(1)>',
}
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@pytest.fixture
async def web(make_client: Callable[..., httpx.AsyncClient]) -> AsyncIterator[httpx.AsyncClient]:
    async with make_client(token=None) as c:
        yield c


async def csrf_of(web: httpx.AsyncClient, path: str = "/") -> str:
    """The CSRF token a page's forms carry (and the cookie it matches, now in the client)."""
    page = await web.get(path)
    assert page.status_code == 200, page.text
    found = CSRF.search(page.text)
    assert found, "the page has no form with a CSRF token"
    return found.group(1)


async def failed_job(conn: asyncpg.Connection, job_type: str = "mail",
                     error: str = "boom", **columns: Any) -> uuid.UUID:
    """A job that failed for good, as `fail` leaves it."""
    row = await conn.fetchrow(
        """INSERT INTO jobs (job_type, payload, status, retry_count, max_retries, error_message,
                             error_history, started_at, completed_at, queue)
           VALUES ($1, $2::jsonb, 'failed', 1, 1, $3::text,
                   jsonb_build_array(
                       jsonb_build_object('attempt', 1, 'error', $3::text, 'at', now()),
                       jsonb_build_object('attempt', 2, 'error', $3::text, 'at', now(),
                                          'worker_id', 7)),
                   now(), now(), $4)
           RETURNING id""",
        job_type, columns.get("payload", "{}"), error, columns.get("queue", "default"))
    return row["id"]


# -- what the pages show ------------------------------------------------------------


async def test_the_overview_counts_jobs_by_status_and_queue(
        web: httpx.AsyncClient, engine: AsyncEngine, conn: asyncpg.Connection) -> None:
    async with engine.begin() as s:
        await enqueue_many(s, "mail", [{}] * 3, queue="emails")
        await enqueue(s, "report", {}, queue="reports")
    await failed_job(conn, queue="emails")
    await conn.execute("INSERT INTO jobqueue_queues (name, paused) VALUES ('reports', true)")

    page = await web.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    html = page.text
    assert '<span class="n" data-status="pending">4</span>' in html
    assert '<span class="n" data-status="failed">1</span>' in html
    emails = re.search(r'<tr data-queue="emails">(.*?)</tr>', html, re.S)
    reports = re.search(r'<tr data-queue="reports">(.*?)</tr>', html, re.S)
    assert emails and reports
    assert re.findall(r"<td>([^<]*)</td>", emails.group(1))[:4] == ["3", "0", "0", "1"]
    assert '<td class="state">paused</td>' in reports.group(1)
    assert "Resume" in reports.group(1) and "Pause" in emails.group(1)
    # the live fragment is the same markup without the page around it
    live = await web.get("/dashboard/overview")
    assert live.status_code == 200 and "<html" not in live.text
    assert '<tr data-queue="emails">' in live.text


async def test_the_charts_count_finished_jobs_per_bucket(
        web: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    """Jobs finished 30–40 s ago at 20 per second show up in the throughput
    line of a bucket before the current one, and nowhere else."""
    await conn.execute(
        """INSERT INTO jobs (job_type, status, created_at, run_at, started_at, completed_at)
           SELECT 'x', 'completed', t - interval '50 ms', t - interval '50 ms',
                  t - interval '10 ms', t
           FROM (SELECT date_bin('10 s', now(), 'epoch') - interval '30 s'
                        + i * interval '50 ms' AS t
                 FROM generate_series(0, 199) AS i) AS ticks""")
    html = (await web.get("/dashboard/overview")).text
    line = re.search(r'<polyline class="line completed" points="([^"]+)"', html)
    assert line, "no throughput line"
    ys = [float(p.split(",")[1]) for p in line.group(1).split()]
    baseline = max(ys)  # zero sits at the bottom of the plot
    raised = [y for y in ys if y < baseline]
    assert len(raised) == 1, ys  # exactly one bucket holds them
    assert re.search(r'text-anchor="end">20</text>', html)  # the axis tops at 20 jobs/s
    p99 = re.search(r'<polyline class="line p99" points="([^"]+)"', html)
    assert p99 and len(p99.group(1).split()) == 1  # one bucket with completions


async def test_a_hostile_job_renders_as_text_everywhere(
        web: httpx.AsyncClient, engine: AsyncEngine, conn: asyncpg.Connection) -> None:
    payload = json.dumps({"note": HOSTILE["script"], "html": HOSTILE["attribute"]})
    job_id = await failed_job(conn, job_type=HOSTILE["script"], error=HOSTILE["attribute"],
                              payload=payload)
    await conn.execute("UPDATE jobs SET result = to_jsonb($1::text) WHERE id = $2",
                       HOSTILE["script"], job_id)
    pages = {
        "job": await web.get(f"/dashboard/jobs/{job_id}"),
        "list": await web.get("/dashboard/jobs?status=failed"),
        "list filtered": await web.get("/dashboard/jobs",
                                       params={"status": "failed", "type": HOSTILE["script"]}),
    }
    for name, page in pages.items():
        assert page.status_code == 200, name
        assert HOSTILE["script"] not in page.text, name
        assert "<img" not in page.text, name
        assert "&lt;script&gt;" in page.text, name  # there, as text
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert "onerror=alert(1)&gt;" in pages["job"].text  # the error, escaped
    assert (await web.get("/dashboard/jobs", params={"status": "failed",
                                                     "type": "other"})).text.count(
        "/dashboard/jobs/") == 0


async def test_a_job_page_shows_its_attempts_payload_and_result(
        web: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    job_id = await failed_job(conn, error="ConnectionError: smtp down",
                              payload='{"to": "a@example.com"}')
    html = (await web.get(f"/dashboard/jobs/{job_id}")).text
    attempts = re.findall(r'<li class="failed">.*?attempt (\d) failed(.*?)</li>', html, re.S)
    assert [a for a, _ in attempts] == ["1", "2"]
    assert "(worker 7)" in attempts[1][1] and "worker" not in attempts[0][1]
    assert "ConnectionError: smtp down" in html
    assert "&#34;to&#34;: &#34;a@example.com&#34;" in html  # indented JSON, escaped
    assert "failed for good" in html
    assert (await web.get(f"/dashboard/jobs/{uuid.uuid4()}")).status_code == 404
    assert (await web.get("/dashboard/jobs/not-an-id")).status_code == 404


# -- actions -------------------------------------------------------------------------


async def test_retry_cancel_pause_resume_act_and_say_so(
        web: httpx.AsyncClient, engine: AsyncEngine, conn: asyncpg.Connection) -> None:
    failed = await failed_job(conn)
    async with engine.begin() as s:
        waiting = await enqueue(s, "mail", {})
    token = await csrf_of(web)

    retried = await web.post(f"/dashboard/jobs/{failed}/retry", data={"csrf": token})
    assert retried.status_code == 303
    assert await conn.fetchval("SELECT status FROM jobs WHERE id = $1", failed) == "pending"
    shown = await web.get(retried.headers["location"])
    assert "The job will run again" in shown.text
    again = await web.post(f"/dashboard/jobs/{failed}/retry", data={"csrf": token})
    assert again.status_code == 409 and "only failed jobs can be retried" in again.text

    cancelled = await web.post(f"/dashboard/jobs/{waiting}/cancel",
                               data={"csrf": token, "reason": "not needed"})
    assert cancelled.status_code == 303
    row = await conn.fetchrow("SELECT status, error_message FROM jobs WHERE id = $1", waiting)
    assert tuple(row) == ("failed", "cancelled: not needed")
    assert "The job is cancelled." in (await web.get(cancelled.headers["location"])).text

    assert ">Pause<" in (await web.get("/")).text  # the overview read, kept 1.5 s
    paused = await web.post("/dashboard/queues/default/pause", data={"csrf": token})
    assert paused.status_code == 303
    assert await conn.fetchval("SELECT paused FROM jobqueue_queues WHERE name = 'default'")
    back = (await web.get(paused.headers["location"])).text
    # The page it returns to shows the change, not the reading from before it.
    assert "paused on every worker" in back and ">Resume<" in back and ">Pause<" not in back
    await web.post("/dashboard/queues/default/resume", data={"csrf": token})
    assert not await conn.fetchval("SELECT paused FROM jobqueue_queues WHERE name = 'default'")
    bad = await web.post("/dashboard/queues/no%20such/pause", data={"csrf": token})
    assert bad.status_code == 400 and "queue" in bad.text


async def test_an_action_without_the_forms_token_or_from_another_site_is_refused(
        web: httpx.AsyncClient, make_client: Callable[..., httpx.AsyncClient],
        conn: asyncpg.Connection) -> None:
    job_id = await failed_job(conn)
    token = await csrf_of(web)
    forged = {
        "no token": {"data": {}},
        "wrong token": {"data": {"csrf": "x" * 43}},
        "other origin": {"data": {"csrf": token}, "headers": {"origin": "http://evil.example"}},
        "other port": {"data": {"csrf": token}, "headers": {"origin": "http://localhost:9999"}},
        "cross-site fetch": {"data": {"csrf": token}, "headers": {"sec-fetch-site": "cross-site"}},
        "same-site fetch": {"data": {"csrf": token}, "headers": {"sec-fetch-site": "same-site"}},
        "null origin": {"data": {"csrf": token}, "headers": {"origin": "null"}},
    }
    for name, request in forged.items():
        answer = await web.post(f"/dashboard/jobs/{job_id}/retry", **request)
        assert answer.status_code == 403, name
        assert "Refused" in answer.text, name
    # without its cookie a token copied from a page is worth nothing
    async with make_client(token=None) as stranger:
        answer = await stranger.post(f"/dashboard/jobs/{job_id}/retry", data={"csrf": token})
        assert answer.status_code == 403
    assert await conn.fetchval("SELECT status FROM jobs WHERE id = $1", job_id) == "failed"
    # the same browser, same origin, with its token: it works (so the refusals meant it)
    ok = await web.post(f"/dashboard/jobs/{job_id}/retry", data={"csrf": token},
                        headers={"origin": "http://localhost", "sec-fetch-site": "same-origin"})
    assert ok.status_code == 303


async def test_the_api_refuses_what_another_site_makes_a_browser_send(
        web: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    """Without a token the API listens on loopback, but any page the user
    opens could post a form to it; a browser says where such a form comes from."""
    job_id = await failed_job(conn)
    forged = await web.post(f"/jobs/{job_id}/retry", headers={"origin": "http://evil.example"})
    assert forged.status_code == 403
    forged = await web.post("/queues/default/pause", headers={"sec-fetch-site": "cross-site"})
    assert forged.status_code == 403
    assert await conn.fetchval("SELECT status FROM jobs WHERE id = $1", job_id) == "failed"
    assert await conn.fetchval("SELECT count(*) FROM jobqueue_queues") == 0
    assert (await web.post(f"/jobs/{job_id}/retry")).status_code == 200  # curl, a service


# -- with a token ----------------------------------------------------------------------


async def test_with_a_token_every_page_asks_for_a_login_first(
        make_client: Callable[..., httpx.AsyncClient], conn: asyncpg.Connection) -> None:
    job_id = await failed_job(conn)
    async with make_client(token=TOKEN) as web:
        for path in ("/", "/dashboard/jobs", f"/dashboard/jobs/{job_id}", "/dashboard/overview"):
            answer = await web.get(path)
            assert answer.status_code == 303, path
            assert answer.headers["location"] == "/dashboard/login"
        assert (await web.get("/dashboard/static/dashboard.css")).status_code == 200
        login = await web.get("/dashboard/login")
        assert login.status_code == 200 and 'type="password"' in login.text
        assert "Log out" not in login.text
        csrf = CSRF.search(login.text).group(1)  # type: ignore[union-attr]
        refused = await web.post(f"/dashboard/jobs/{job_id}/retry", data={"csrf": csrf})
        assert refused.status_code == 401

        wrong = await web.post("/dashboard/login", data={"csrf": csrf, "token": "guess"})
        assert wrong.status_code == 401 and "not the token" in wrong.text
        assert auth.SESSION_COOKIE not in web.cookies
        right = await web.post("/dashboard/login", data={"csrf": csrf, "token": TOKEN})
        assert right.status_code == 303
        cookie = right.headers["set-cookie"]
        assert cookie.startswith(f"{auth.SESSION_COOKIE}=")
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
        assert TOKEN not in cookie
        home = await web.get("/")
        assert home.status_code == 200 and "Log out" in home.text
        assert (await web.post(f"/dashboard/jobs/{job_id}/retry",
                               data={"csrf": csrf})).status_code == 303
        # the API still wants its bearer token, the cookie is not one
        assert (await web.get(f"/jobs/{job_id}")).status_code == 401

        logout = await web.post("/dashboard/logout", data={"csrf": csrf})
        assert logout.status_code == 303
        assert (await web.get("/")).status_code == 303

    async with make_client(token=TOKEN) as web:
        web.cookies.set(auth.SESSION_COOKIE, "A" * 43)
        assert (await web.get("/")).status_code == 303  # a forged session


@pytest.mark.parametrize(("base", "host", "secure"), [
    ("http://localhost", "localhost:8000", False),  # plain HTTP on this machine
    ("http://localhost", "127.0.0.1:8000", False),
    ("http://localhost", "jobs.example.org", True),  # by name: through a TLS proxy
    ("https://localhost", "localhost", True),  # TLS, as the server sees it
])
async def test_the_cookies_are_secure_unless_plain_http_to_a_loopback_name(
        make_client: Callable[..., httpx.AsyncClient], base: str, host: str,
        secure: bool) -> None:
    """Issue 49: the cookies got `Secure` only when the server saw HTTPS,
    which behind a proxy that terminates TLS took `--forwarded-allow-ips`;
    the documented setup (serve on 127.0.0.1, the proxy in front) sent the
    session cookie without it. A request by a name that is not a loopback
    one came across the network: meant to be HTTPS."""
    async with make_client(token=TOKEN) as web:
        web.base_url = httpx.URL(base)
        form = await web.get("/dashboard/login", headers={"host": host})
        csrf = CSRF.search(form.text).group(1)  # type: ignore[union-attr]
        # Sent by hand: the client's jar keeps a Secure cookie from plain HTTP to itself.
        jar = {"host": host, "cookie": f"{auth.CSRF_COOKIE}={csrf}"}
        login = await web.post("/dashboard/login", data={"csrf": csrf, "token": TOKEN},
                               headers=jar)
        assert login.status_code == 303, login.text
        secret = login.headers["set-cookie"].split(";")[0]
        logout = await web.post("/dashboard/logout", data={"csrf": csrf},
                                headers={**jar, "cookie": f"{jar['cookie']}; {secret}"})
        assert logout.status_code == 303
    cookies = [form.headers["set-cookie"], login.headers["set-cookie"],
               *logout.headers.get_list("set-cookie")]
    assert [c.split("=")[0] for c in cookies] == [auth.CSRF_COOKIE, auth.SESSION_COOKIE,
                                                   auth.SESSION_COOKIE, auth.CSRF_COOKIE]
    assert all(("; secure" in c.lower()) is secure for c in cookies), cookies


async def logged_in(web: httpx.AsyncClient, token: str = TOKEN) -> str:
    """Logs the client in; the CSRF value its forms carry."""
    csrf = await csrf_of(web, "/dashboard/login")
    answer = await web.post("/dashboard/login", data={"csrf": csrf, "token": token})
    assert answer.status_code == 303 and auth.SESSION_COOKIE in web.cookies
    return csrf


async def test_logging_out_ends_the_session_for_a_copy_of_its_cookie(
        make_client: Callable[..., httpx.AsyncClient], conn: asyncpg.Connection) -> None:
    """Issue 31, item 4: a cookie and CSRF value copied before the logout
    paused a queue after it, for up to 12 hours."""
    async with make_client(token=TOKEN) as web:
        csrf = await logged_in(web)
        copied = dict(web.cookies)
        assert await conn.fetchval("SELECT count(*) FROM jobqueue_sessions") == 1
        assert (await web.post("/dashboard/logout", data={"csrf": csrf})).status_code == 303
        assert await conn.fetchval("SELECT count(*) FROM jobqueue_sessions") == 0
    # Another process serving the same database (a new app) sees it too.
    async with make_client(token=TOKEN) as other:
        other.cookies.update(copied)
        assert (await other.get("/")).status_code == 303
        pause = await other.post("/dashboard/queues/default/pause", data={"csrf": csrf})
        assert pause.status_code == 401
    assert await conn.fetchval("SELECT count(*) FROM jobqueue_queues") == 0


async def test_a_session_ends_when_it_expires_or_the_token_changes(
        make_client: Callable[..., httpx.AsyncClient], conn: asyncpg.Connection) -> None:
    async with make_client(token=TOKEN) as web:
        await logged_in(web)
        copied = dict(web.cookies)
        assert (await web.get("/")).status_code == 200
    async with make_client(token="a-new-token-0123456") as web:
        web.cookies.update(copied)
        assert (await web.get("/")).status_code == 303
    async with make_client(token=TOKEN) as web:
        web.cookies.update(copied)
        assert (await web.get("/")).status_code == 200
        await conn.execute("UPDATE jobqueue_sessions SET expires_at = now() - interval '1 s'")
        assert (await web.get("/")).status_code == 303
        web.cookies.clear()
        await logged_in(web)  # a new login clears the expired one
    assert await conn.fetchval("SELECT count(*) FROM jobqueue_sessions") == 1


# -- lists, a page at a time --------------------------------------------------------


async def walk(web: httpx.AsyncClient, params: dict[str, str]) -> list[str]:
    """Every job id of a list, following its next links to the end."""
    seen: list[str] = []
    query: str | None = httpx.QueryParams(params).__str__()
    while query is not None:
        page = await web.get(f"/dashboard/jobs?{query}")
        assert page.status_code == 200, page.text
        seen += re.findall(r'href="/dashboard/jobs/([0-9a-f-]{36})"', page.text)
        found = re.search(r'href="\?([^"]+)" rel="next"', page.text)
        query = found.group(1).replace("&amp;", "&") if found else None
    return seen


async def test_a_list_shows_whole_ids_that_tell_jobs_apart(
        web: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    """Ids made in the same minute share their first digits: the list shows
    them whole, to copy into `jobqueue status` or a log search."""
    ids = [uuid.UUID(f"0193aaaa-bbbb-7ccc-8ddd-00000000000{n}") for n in (1, 2)]
    for job_id in ids:
        await conn.execute("INSERT INTO jobs (id, job_type) VALUES ($1, 'mail')", job_id)
    html = (await web.get("/dashboard/jobs", params={"status": "waiting"})).text
    shown = re.findall(r'<td class="id"><a href="[^"]*">([^<]+)</a></td>', html)
    assert sorted(shown) == [str(job_id) for job_id in ids]


async def test_each_list_walks_every_job_once_in_its_order(
        web: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    await conn.execute(
        """INSERT INTO jobs (job_type, queue, priority, status, run_at, started_at,
                             completed_at, error_message, worker_id)
           SELECT CASE WHEN i % 3 = 0 THEN 'b' ELSE 'a' END, 'q' || (i % 3), i % 4 - 1,
                  (ARRAY['pending', 'retrying', 'processing', 'completed', 'failed'])[i % 5 + 1],
                  now() - (i % 17) * interval '1 s', now() - (i % 13) * interval '1 s',
                  CASE WHEN i % 5 >= 3 THEN now() - (i % 11) * interval '1 s' END,
                  CASE WHEN i % 5 = 4 THEN 'err' END,
                  CASE WHEN i % 5 = 2 THEN 1 END
           FROM generate_series(1, 700) AS i""")
    orders = {
        "waiting": ("status IN ('pending', 'retrying')",
                    "queue, priority DESC, run_at, id"),
        "running": ("status = 'processing'", "started_at DESC, id DESC"),
        "completed": ("status = 'completed'", "completed_at DESC, id DESC"),
        "failed": ("status = 'failed'", "completed_at DESC, id DESC"),
    }
    for tab, (where, order) in orders.items():
        for extra, params in (("", {}), (" AND queue = 'q1'", {"queue": "q1"}),
                              (" AND job_type = 'b'", {"type": "b"})):
            expected = [str(r["id"]) for r in await conn.fetch(
                f"SELECT id FROM jobs WHERE {where}{extra} ORDER BY {order}")]
            assert len(expected) > 50 or extra, (tab, len(expected))  # more than one page
            assert await walk(web, {"status": tab, **params}) == expected, (tab, params)
    before = await conn.fetchval("SELECT to_char((min(completed_at) + interval '5 s') AT TIME "
                                 "ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS') FROM jobs")
    older = await walk(web, {"status": "failed", "before": before})
    expected = [str(r["id"]) for r in await conn.fetch(
        "SELECT id FROM jobs WHERE status = 'failed' "
        "AND completed_at < CAST($1::text AS timestamp) AT TIME ZONE 'UTC' "
        "ORDER BY completed_at DESC, id DESC", before)]
    assert older == expected and 0 < len(older) < 140


@pytest.mark.parametrize("query", ["status=bogus", "status=failed&after=%%%",
                                   "status=waiting&after=WzFd", "status=failed&before=soon",
                                   "status=failed&queue=a%20b"])
async def test_a_bad_filter_or_page_link_is_a_400_page(web: httpx.AsyncClient,
                                                       query: str) -> None:
    answer = await web.get(f"/dashboard/jobs?{query}")
    assert answer.status_code == 400
    assert re.search(r'class="notice error" role="alert">[^<]+<', answer.text)


@pytest.mark.parametrize(("field", "quoted"), [
    ("status", True), ("before", True), ("queue", True), ("type", False)])
async def test_a_400_page_quotes_a_bad_filter_cut_short_and_escaped(
        web: httpx.AsyncClient, field: str, quoted: bool) -> None:
    """Issue 49: `status=` (and `before=`) came back whole on the 400 page:
    a page as large as the query; each filter is quoted 40 characters at
    most."""
    value = "<script>" + "s" * 30_000  # httpx sends 64 KB of query at most
    answer = await web.get("/dashboard/jobs", params={field: value})
    assert answer.status_code == 400
    assert len(answer.content) < 10_000, len(answer.content)
    notice = re.search(r'class="notice error" role="alert">([^<]+)<', answer.text)
    assert notice and ("s" * 20 in notice.group(1)) is quoted, notice
    assert "s" * 40 not in notice.group(1)
    assert "<script>" not in answer.text


def _cursor(values: list[Any]) -> str:
    """A page link's `after` as the dashboard encodes it, holding `values`."""
    raw = json.dumps(values, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


_ID = "01a24515-f1a2-71c0-8000-00005e16383a"
_NUL, _SURROGATE = "a\u0000b", "a\ud800b"
#: What the issue's probes sent, and the like: each was a 500 or could be.
HOSTILE_QUERIES = [
    "status=completed&before=0001-01-01T00:00:00%2B14:00",
    "status=failed&before=9999-12-31T23:59:59-14:00",
    f"status=completed&after={_cursor(['0001-01-01T00:00:00+14:00', _ID])}",
    f"status=waiting&after={_cursor(['default', 2**31, '2026-01-01T00:00:00+00:00', _ID])}",
    f"status=waiting&after={_cursor([_NUL, 0, '2026-01-01T00:00:00+00:00', _ID])}",
    f"status=waiting&after={_cursor([_SURROGATE, 0, '2026-01-01T00:00:00+00:00', _ID])}",
    f"status=waiting&after={_cursor(['default', 0, '0001-01-01T00:00:00+14:00', _ID])}",
    "status=waiting&queue=a%00b", "status=waiting&queue=a%ED%A0%80b",
    "status=failed&type=a%00b",
]


@pytest.mark.parametrize("query", HOSTILE_QUERIES)
async def test_no_filter_or_page_link_reaches_a_500(web: httpx.AsyncClient, query: str) -> None:
    """Out-of-range times (0001-01-01 at +14:00 is before year 1 in UTC), a
    priority past int4, a NUL or a lone surrogate in a cursor or a filter:
    a 400 page that says what is wrong, never a 500 (issue 31, item 2)."""
    answer = await web.get(f"/dashboard/jobs?{query}")
    assert answer.status_code == 400, answer.text[:300]
    assert re.search(r'class="notice error" role="alert">[^<]+<', answer.text)


@pytest.mark.parametrize("cookie", [b"\xb2", "\u00b2".encode(), b"9" * 5000,
                                    b"1" * 13 + b".abc", b"-1.abc", b"1.2.3", b""])
async def test_a_forged_session_cookie_asks_for_a_login(
    make_client: Callable[..., httpx.AsyncClient], cookie: bytes
) -> None:
    """A superscript digit passed `str.isdigit()` and failed `int()`; 5,000
    digits failed `int()` too: a 500 on every page, the login page included,
    which a page on another port of the same host can plant."""
    async with make_client(token=TOKEN) as web:
        headers = [(b"cookie", b"jobqueue_session=" + cookie)]
        page = await web.get("/", headers=headers)
        assert page.status_code == 303 and page.headers["location"].endswith("/dashboard/login")
        login = await web.get("/dashboard/login", headers=headers)
        assert login.status_code == 200


# -- where it is mounted ---------------------------------------------------------------


async def test_a_router_under_a_prefix_carries_the_dashboard_there(engine: AsyncEngine) -> None:
    app = FastAPI()
    app.include_router(create_router(engine, token=None), prefix="/queue")
    app.include_router(create_router(engine, token=None, dashboard=False), prefix="/bare")
    async with client_for(app) as web:
        page = await web.get("/queue/")
        assert page.status_code == 200
        links = re.findall(r'(?:href|action|src|data-live-url)="(/[^"]*)"', page.text)
        assert links and all(link.startswith("/queue/") for link in links), links
        assert (await web.get("/queue/dashboard/static/dashboard.js")).status_code == 200
        assert (await web.get("/bare/")).status_code == 404
        assert (await web.get("/bare/queues")).status_code == 200


async def test_the_overview_is_read_once_for_many_viewers(engine: AsyncEngine) -> None:
    """However many browsers watch, one reading serves them all until it is
    `ttl` old; then the next viewer gets a new one."""
    import asyncio

    from jobqueue.ops.dashboard.overview import Overview

    seen = Overview(ttl=0.5)

    async def view() -> object:
        async with engine.connect() as c:
            return await seen.get(c)

    first = await asyncio.gather(*(view() for _ in range(10)))
    assert all(s is first[0] for s in first)
    fresh = await wait_for(lambda: _newer(view, first[0]), timeout=5,
                           message="a reading newer than the first")
    assert fresh.read_at > first[0].read_at  # type: ignore[attr-defined]


async def _newer(view: Callable[[], Any], old: object) -> object | None:
    s = await view()
    return s if s is not old else None
