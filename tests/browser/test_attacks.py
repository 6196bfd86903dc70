"""A browser as the attacker (issue 31): DNS rebinding against a `jobqueue
serve` without a token, and a session cookie copied before a logout.

Rebinding, as it happens: a page loaded from rebind.attacker.example (the
attacker's server, here a page the browser is handed for that address), whose
name then resolves to 127.0.0.1 (Chromium's --host-resolver-rules), sends
requests to its own origin. For the browser they are same-origin: Origin
and Sec-Fetch-Site say nothing is wrong; only the Host header gives it
away. Recent Chromium also blocks a public page's requests to a loopback
address (Private / Local Network Access); the browser here runs with that
switched off, as in Firefox, Safari and older Chromium, so that what is
tested is the server's own refusal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import asyncpg

from tests.browser.conftest import CHROMIUM, Serve, Served

if TYPE_CHECKING:
    from playwright.async_api import Browser, Page, Route

ATTACKER = "rebind.attacker.example"
TOKEN = "browser-attack-token-0123"

#: What the attacker's page does once its name points at the loopback: reads
#: a job, pauses a queue, enqueues; and writes what it got into the page.
ATTACK = """<!doctype html><title>cute cats</title><pre id="out"></pre><script>
(async () => {
  const out = [];
  for (const [method, path, body] of [["GET", "/jobs/JOB"], ["POST", "/queues/default/pause"],
                                      ["POST", "/jobs", '{"job_type": "evil"}'],
                                      ["GET", "/"]]) {
    try {
      const headers = body ? {"content-type": "application/json"} : {};
      const r = await fetch(path, {method, body, headers});
      out.push(method + " " + path + " " + r.status + " " + (await r.text()).includes("secret"));
    } catch (e) { out.push(method + " " + path + " error " + e); }
  }
  document.getElementById("out").textContent = out.join("\\n");
  document.title = "done";
})();
</script>"""


async def test_a_rebound_page_reads_and_changes_nothing(
        browser: Browser, served: Served, conn: asyncpg.Connection) -> None:
    job_id = await conn.fetchval("INSERT INTO jobs (job_type, payload) "
                                 "VALUES ('t', '{\"secret\": 1}') RETURNING id")
    port = served.url.rsplit(":", 1)[1]
    rebound = await browser.browser_type.launch(
        executable_path=CHROMIUM, headless=True,
        args=[f"--host-resolver-rules=MAP {ATTACKER} 127.0.0.1",
              "--disable-features=PrivateNetworkAccessRespectPreflightResults,"
              "BlockInsecurePrivateNetworkRequests,LocalNetworkAccessChecks,"
              "PrivateNetworkAccessSendPreflights"])
    try:
        page = await rebound.new_page()

        async def attacker_page(route: Route) -> None:  # served before the rebinding
            await route.fulfill(status=200, content_type="text/html",
                                body=ATTACK.replace("JOB", str(job_id)))

        await page.route(f"http://{ATTACKER}:{port}/cats.html", attacker_page)
        await page.goto(f"http://{ATTACKER}:{port}/cats.html")
        await page.wait_for_function("document.title === 'done'")
        lines = (await page.locator("#out").text_content() or "").splitlines()
    finally:
        await rebound.close()
    assert lines == [f"GET /jobs/{job_id} 400 false", "POST /queues/default/pause 400 false",
                     "POST /jobs 400 false", "GET / 400 false"], lines
    assert await conn.fetchval("SELECT count(*) FROM jobqueue_queues") == 0
    assert await conn.fetchval("SELECT count(*) FROM jobs") == 1


async def test_a_cookie_copied_before_the_logout_is_worth_nothing_after(
        serve: Serve, page: Page, browser: Browser, conn: asyncpg.Connection) -> None:
    served = await serve(token=TOKEN)
    await page.goto(served.url)
    await page.fill("input[name=token]", TOKEN)
    await page.click("button:has-text('Log in')")
    await page.wait_for_url(f"{served.url}/")
    stolen = await page.context.cookies()
    assert any(c["name"] == "jobqueue_session" for c in stolen)
    await page.click("text=Log out")
    await page.wait_for_url(f"{served.url}/dashboard/login")

    thief = await browser.new_context()
    try:
        await thief.add_cookies(stolen)  # type: ignore[arg-type]
        other = await thief.new_page()
        answer = await other.goto(f"{served.url}/dashboard/jobs")
        assert answer is not None and other.url == f"{served.url}/dashboard/login"
    finally:
        await thief.close()
    assert await conn.fetchval("SELECT count(*) FROM jobqueue_sessions") == 0
