"""The dashboard in a real browser, against a real `jobqueue serve` and a real
worker: it loads with and without a token, the overview follows jobs as they
finish without a reload, retry / cancel / pause work end to end, hostile job
content stays inert, and a cross-site form is refused.

With JOBQUEUE_SCREENSHOTS=<folder>, the overview and job page tests also save
the README's screenshots there.
"""

from __future__ import annotations

import http.server
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from jobqueue import enqueue, enqueue_many
from jobqueue.embedded.pair import free_ports
from jobqueue.testing import wait_for
from tests.browser.conftest import PHONE, Serve, Served

if TYPE_CHECKING:
    from playwright.async_api import Dialog, Page

TOKEN = "browser-s3cret-token"
SCREENSHOTS = os.environ.get("JOBQUEUE_SCREENSHOTS")
HOSTILE_TYPE = "<script>window.__pwned = 1</script>"
HOSTILE_ERROR = '"><img src=x onerror="window.__pwned = 2">'


def expect(*args: Any) -> Any:
    from playwright.async_api import expect as playwright_expect

    return playwright_expect(*args)


async def failed_job(conn: asyncpg.Connection, job_type: str = "noop",
                     error: str = "ConnectionError: smtp down", payload: str = "{}") -> uuid.UUID:
    """A job that failed for good after two attempts, as `fail` leaves it."""
    return await conn.fetchval(
        """INSERT INTO jobs (job_type, payload, status, retry_count, max_retries, error_message,
                             error_history, started_at, completed_at)
           VALUES ($1, $2::jsonb, 'failed', 1, 1, $3::text,
                   jsonb_build_array(
                       jsonb_build_object('attempt', 1, 'error', $3::text,
                                          'at', now() - interval '3 s'),
                       jsonb_build_object('attempt', 2, 'error', $3::text, 'at', now(),
                                          'worker_id', 1)),
                   now() - interval '1 s', now())
           RETURNING id""", job_type, payload, error)


class Confirmations:
    """Answers every confirmation a page asks (yes, or no while `accept` is
    False) and keeps what it asked."""

    def __init__(self, page: Page, accept: bool = True) -> None:
        self.accept = accept
        self.asked: list[str] = []
        page.on("dialog", self._answer)

    async def _answer(self, dialog: Dialog) -> None:
        self.asked.append(dialog.message)
        await (dialog.accept() if self.accept else dialog.dismiss())


async def test_the_overview_follows_jobs_as_a_worker_finishes_them(
        served: Served, page: Page, console_errors: list[str], engine: AsyncEngine,
        spawn_worker: Callable[..., Any]) -> None:
    async with engine.begin() as s:
        await enqueue_many(s, "sleep", [{"seconds": 0.02}] * 40, queue="emails")
        await enqueue_many(s, "noop", [{}] * 10, queue="reports")
    await page.goto(served.url)
    pending = page.locator('[data-status="pending"]')
    await expect(pending).to_have_text("50")
    await expect(page.locator('[data-status="completed"]')).to_have_text("0")
    await page.evaluate("window.__loadedOnce = true")  # gone if the page reloads

    worker = spawn_worker()
    await expect(page.locator('[data-status="completed"]')).to_have_text("50")
    await expect(pending).to_have_text("0")
    assert await page.evaluate("window.__loadedOnce") is True  # updated in place
    row = page.locator("table.workers tbody tr").first
    await expect(row).to_contain_text(f":{worker.pid}")
    await expect(row).to_contain_text("active")
    emails = page.locator('tr[data-queue="emails"] td')
    await expect(emails.nth(3)).to_have_text("40")  # completed
    # the throughput chart's scale grows from its empty 0–1 once the burst's bucket closes
    top = page.locator("figure.chart").first.locator("text.label").first
    await expect(top).not_to_have_text("1")
    assert console_errors == []
    if SCREENSHOTS:
        await page.screenshot(path=str(Path(SCREENSHOTS) / "dashboard-overview.png"),
                              full_page=True)


async def test_retry_cancel_and_pause_work_from_the_page(
        served: Served, page: Page, console_errors: list[str], engine: AsyncEngine,
        conn: asyncpg.Connection) -> None:
    failed = await failed_job(conn, payload='{"to": "a@example.com", "attempt": [1, 2]}')
    async with engine.begin() as s:
        waiting = await enqueue(s, "noop", {}, queue="emails")

    confirm = Confirmations(page, accept=False)  # first, say no: nothing happens
    await page.goto(f"{served.url}/dashboard/jobs/{failed}")
    if SCREENSHOTS:
        await page.screenshot(path=str(Path(SCREENSHOTS) / "dashboard-job.png"),
                              full_page=True)
    await page.get_by_role("button", name="Retry").click()
    await wait_for(lambda: confirm.asked, timeout=10, message="the confirmation")
    assert "Run this failed job again" in confirm.asked[0]
    assert await conn.fetchval("SELECT status FROM jobs WHERE id = $1", failed) == "failed"
    await expect(page.locator(".status").first).to_have_text("failed")

    confirm.accept = True
    await page.get_by_role("button", name="Retry").click()
    await expect(page.get_by_role("status")).to_contain_text("The job will run again")
    await expect(page.locator(".status").first).to_have_text("pending")
    assert await conn.fetchval("SELECT status FROM jobs WHERE id = $1", failed) == "pending"
    assert len(confirm.asked) == 2

    await page.goto(f"{served.url}/dashboard/jobs/{waiting}")
    await page.get_by_placeholder("reason (optional)").fill("customer left")
    await page.get_by_role("button", name="Cancel").click()
    await expect(page.get_by_role("status")).to_contain_text("The job is cancelled.")
    assert tuple(await conn.fetchrow("SELECT status, error_message FROM jobs WHERE id = $1",
                                     waiting)) == ("failed", "cancelled: customer left")

    await page.goto(served.url)
    queue = page.locator('tr[data-queue="emails"]')
    await queue.get_by_role("button", name="Pause").click()
    await expect(page.get_by_role("status")).to_contain_text("paused on every worker")
    await expect(queue.locator("td.state")).to_have_text("paused")
    assert await conn.fetchval("SELECT paused FROM jobqueue_queues WHERE name = 'emails'")
    await queue.get_by_role("button", name="Resume").click()
    await expect(queue.locator("td.state")).to_have_text("running")
    assert console_errors == []


async def test_hostile_job_content_renders_as_text_and_runs_nothing(
        served: Served, page: Page, console_errors: list[str],
        conn: asyncpg.Connection) -> None:
    job_id = await failed_job(conn, job_type=HOSTILE_TYPE, error=HOSTILE_ERROR,
                              payload='{"html": "<script>window.__pwned = 3</script>"}')
    confirm = Confirmations(page)
    for path in (f"/dashboard/jobs/{job_id}", "/dashboard/jobs?status=failed", "/"):
        await page.goto(served.url + path)
        await expect(page.locator("main")).to_contain_text("failed")
        assert await page.evaluate("window.__pwned") is None, path
        assert await page.locator("main img").count() == 0, path
        assert await page.locator("main script").count() == 0, path
    await page.goto(f"{served.url}/dashboard/jobs/{job_id}")
    await expect(page.locator("main")).to_contain_text(HOSTILE_TYPE)  # shown, as text
    await expect(page.locator("main")).to_contain_text(HOSTILE_ERROR)
    assert confirm.asked == [] and console_errors == []


async def test_a_failed_attempts_traceback_opens_on_click_as_text(
        served: Served, page: Page, console_errors: list[str],
        conn: asyncpg.Connection) -> None:
    trace = ('Traceback (most recent call last):\n  File "app/images.py", line 12, in resize\n'
             '    width = options["width"]\n'
             f"KeyError: 'width' {HOSTILE_ERROR}\n")
    error = "KeyError: 'width'"
    job_id = await conn.fetchval(
        """INSERT INTO jobs (job_type, status, retry_count, max_retries, error_message,
                             error_history, started_at, completed_at)
           VALUES ('resize', 'failed', 0, 0, $1::text,
                   jsonb_build_array(jsonb_build_object(
                       'attempt', 1, 'error', $1::text, 'at', now(), 'traceback', $2::text)),
                   now(), now())
           RETURNING id""", error, trace)
    await page.goto(f"{served.url}/dashboard/jobs/{job_id}")
    details = page.locator("main details.traceback")
    await expect(details).to_have_count(1)
    await expect(details.locator("pre")).to_be_hidden()  # folded until asked for
    await details.locator("summary").click()
    await expect(details.locator("pre")).to_be_visible()
    await expect(details.locator("pre")).to_contain_text('width = options["width"]')
    await expect(details.locator("pre")).to_contain_text(HOSTILE_ERROR)  # as text
    assert await page.evaluate("window.__pwned") is None
    assert await page.locator("main img").count() == 0 and console_errors == []


@pytest.fixture
def hostile_site() -> Iterator[Callable[[str], str]]:
    """Another origin (localhost on another port: another site, too): a
    factory serving a page whose form posts itself to `target` at once."""
    pages: dict[str, bytes] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            body = pages.get(self.path, b"")
            self.send_response(200 if body else 404)
            self.send_header("content-type", "text/html")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    port = free_ports(1)[0]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def page_posting_to(target: str) -> str:
        path = f"/{len(pages)}.html"
        pages[path] = (f'<form id="f" method="post" action="{target}">'
                       '<input name="csrf" value="guessed"></form>'
                       '<script>document.getElementById("f").submit()</script>').encode()
        return f"http://localhost:{port}{path}"

    yield page_posting_to
    server.shutdown()
    thread.join()


async def test_a_forged_cross_site_post_is_refused(
        served: Served, page: Page, conn: asyncpg.Connection,
        hostile_site: Callable[[str], str]) -> None:
    job_id = await failed_job(conn)
    await page.goto(served.url)  # the user has the dashboard open: its cookies are set
    for target in (f"{served.url}/dashboard/jobs/{job_id}/retry",
                   f"{served.url}/jobs/{job_id}/retry",
                   f"{served.url}/queues/default/pause"):
        async with page.expect_navigation(url=target) as landed:
            await page.goto(hostile_site(target))
        response = await landed.value
        assert response is not None and response.status == 403, target
        await expect(page.locator("body")).to_contain_text("efused")
    assert await conn.fetchval("SELECT status FROM jobs WHERE id = $1", job_id) == "failed"
    assert await conn.fetchval("SELECT count(*) FROM jobqueue_queues") == 0


async def test_with_a_token_the_dashboard_asks_for_it_once(
        serve: Serve, page: Page, console_errors: list[str], conn: asyncpg.Connection) -> None:
    served = await serve(token=TOKEN)
    job_id = await failed_job(conn)
    await page.goto(f"{served.url}/dashboard/jobs/{job_id}")
    await expect(page).to_have_url(f"{served.url}/dashboard/login")
    await page.get_by_label("Token").fill("a guess")
    await page.get_by_role("button", name="Log in").click()
    await expect(page.get_by_role("alert")).to_have_text("That is not the token.")
    console_errors.clear()  # the 401 of the wrong token, logged by the browser

    await page.get_by_label("Token").fill(TOKEN)
    await page.get_by_role("button", name="Log in").click()
    await expect(page.locator("h1")).to_have_text("Overview")
    cookies = {c["name"]: c for c in await page.context.cookies()}
    session = cookies["jobqueue_session"]
    assert session["httpOnly"] and session["sameSite"] == "Strict"
    assert TOKEN not in session["value"]
    assert await page.evaluate("document.cookie") == ""  # no script can read either cookie
    await page.goto(f"{served.url}/dashboard/jobs/{job_id}")
    await expect(page.locator("h1")).to_contain_text(str(job_id))
    # a second tab of the same browser is logged in too; the overview stays live
    other = await page.context.new_page()
    await other.goto(served.url)
    await expect(other.locator('[data-status="failed"]')).to_have_text("1")
    await page.get_by_role("button", name="Log out").click()
    await expect(page).to_have_url(f"{served.url}/dashboard/login")
    await other.reload()
    await expect(other).to_have_url(f"{served.url}/dashboard/login")
    assert console_errors == []


@pytest.mark.parametrize("viewport", [PHONE], ids=["phone"])
async def test_the_pages_fit_a_phone(served: Served, page: Page, console_errors: list[str],
                                     conn: asyncpg.Connection, engine: AsyncEngine) -> None:
    job_id = await failed_job(conn, error="a long error " * 40)
    async with engine.begin() as s:
        await enqueue_many(s, "noop", [{}] * 3, queue="a-rather-long-queue-name")
    for path in ("/", "/dashboard/jobs?status=failed", f"/dashboard/jobs/{job_id}"):
        await page.goto(served.url + path)
        await expect(page.locator("main h1")).to_be_visible()
        wide = await page.evaluate("document.documentElement.scrollWidth")
        assert wide <= PHONE["width"], (path, wide)  # tables scroll inside, the page does not
    assert console_errors == []
