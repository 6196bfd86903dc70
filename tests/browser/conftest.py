"""Browser tests: a real `jobqueue serve` and a headless Chromium driving it.

The browser is Debian's `chromium` (or JOBQUEUE_CHROMIUM), driven by
Playwright's async API. Not the sync one: it runs an event loop of its own in
the test's thread, which pytest-asyncio then finds running and refuses to run
its session loop beside it, so every async fixture (`db_url`) and every async
test after it would fail. Without a browser, or without the playwright
package, every test that needs one is skipped, all with the same reason, so
that pytest reports them on one line.

    async def test_x(served: Served, page: Page, console_errors: list[str]) -> None:
        await page.goto(served.url)
        await expect(page.locator("h1")).to_have_text("jobqueue")  # waits, with a deadline
        assert console_errors == []
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from jobqueue.api import TOKEN_ENV
from jobqueue.embedded.pair import free_ports
from jobqueue.testing import WorkerProcess, wait_for
from tests.conftest import ROOT

if TYPE_CHECKING:  # the package may be missing: then every browser test is skipped
    from playwright.async_api import Browser, ConsoleMessage, Page, ViewportSize

CHROMIUM_ENV = "JOBQUEUE_CHROMIUM"
#: Viewports for the `viewport` fixture: `@pytest.mark.parametrize("viewport", [PHONE])`.
DESKTOP: ViewportSize = {"width": 1280, "height": 800}
PHONE: ViewportSize = {"width": 390, "height": 844}
#: How long a Playwright action or `expect` waits (ms): generous, for a shared CI machine.
TIMEOUT_MS = 15_000


def find_chromium() -> tuple[str | None, str]:
    """The browser's path, or None and why not (the one line the run prints)."""
    how = f"apt-get install chromium (or set {CHROMIUM_ENV}=/path)"
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        return None, "the playwright package is missing — pip install -e '.[dev]'"
    if os.environ.get(CHROMIUM_ENV):
        given = os.environ[CHROMIUM_ENV]
        found = shutil.which(given)
        return found, "" if found else f"{CHROMIUM_ENV}={given} is not an executable — {how}"
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    return found, "" if found else f"chromium not found — {how}"


CHROMIUM, MISSING = find_chromium()
SKIP_REASON = f"browser tests skipped: {MISSING}"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Skipped here, before any fixture (no database, no server), and raised
    # from this one line, so that `-ra` groups every skip into one line.
    if CHROMIUM is None and "browser" in getattr(item, "fixturenames", ()):
        pytest.skip(SKIP_REASON)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The one line, when `-r` does not already report skips (it does with
    the project's `-ra`)."""
    skipped = terminalreporter.stats.get("skipped", [])
    if "s" not in terminalreporter.reportchars and any(
            r.longrepr[2] == f"Skipped: {SKIP_REASON}" for r in skipped
            if isinstance(r.longrepr, tuple)):
        terminalreporter.write_line(SKIP_REASON)


@dataclass
class Served:
    """A running `jobqueue serve`: its base URL, the token it wants (None:
    none), and its process, whose output is in `process.log_path`."""

    url: str
    token: str | None
    process: WorkerProcess

    def log(self) -> str:
        return self.process.log()


#: The `serve` fixture's type: `await serve(*args, token=None)`.
Serve = Callable[..., Awaitable[Served]]


@pytest.fixture
async def serve(db_url: str, tmp_path: Path) -> AsyncIterator[Serve]:
    """A factory: `await serve(token=None)` starts `jobqueue serve` on this
    test's database and a free loopback port, and returns once the port
    answers. Each is stopped with SIGTERM at teardown, and its log printed
    there, which pytest shows only for a failed test."""
    started: list[Served] = []

    async def start(*args: str, token: str | None = None) -> Served:
        port = free_ports(1)[0]
        log_path = tmp_path / f"serve-{len(started)}.log"
        process = WorkerProcess(db_url, log_path, "--host", "127.0.0.1", "--port", str(port),
                                *args, cwd=ROOT, command=("-m", "jobqueue", "serve"),
                                env={TOKEN_ENV: token or ""})  # empty: no token
        served = Served(f"http://127.0.0.1:{port}", token, process)
        started.append(served)

        async def answers() -> bool:
            if process.proc.poll() is not None:
                raise RuntimeError(f"jobqueue serve exited with {process.proc.returncode}:\n"
                                   f"{served.log()[-2000:]}")
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                return False
            writer.close()
            return True

        await wait_for(answers, timeout=30, interval=0.05, message="jobqueue serve answering")
        return served

    yield start
    for served in started:
        await served.process.stop(timeout=10)
        print(f"--- {served.process.log_path} ---\n{served.log()}")


@pytest.fixture
async def served(serve: Serve) -> Served:
    """`jobqueue serve` without a token, on this test's database."""
    return await serve()


@pytest.fixture(scope="session")
async def browser() -> AsyncIterator[Browser]:
    """One headless Chromium for the run (it takes about a second to start)."""
    from playwright.async_api import async_playwright, expect

    expect.set_options(timeout=TIMEOUT_MS)
    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield chromium
        await chromium.close()


@pytest.fixture
def viewport() -> ViewportSize:
    """The page's size; a test overrides it: `parametrize("viewport", [PHONE], ids=["phone"])`."""
    return DESKTOP


@pytest.fixture
def console_errors() -> list[str]:
    """What `page` saw go wrong: console errors (a failed request among them)
    and uncaught exceptions, as text, in order."""
    return []


@pytest.fixture
async def page(browser: Browser, viewport: ViewportSize, console_errors: list[str]
               ) -> AsyncIterator[Page]:
    """A fresh page in a context of its own (no cookies or storage shared
    between tests)."""
    context = await browser.new_context(viewport=viewport)
    context.set_default_timeout(TIMEOUT_MS)
    tab = await context.new_page()

    def console(message: ConsoleMessage) -> None:
        # Not the favicon Chromium asks of every page that names none: that
        # request is the browser's own, not the page's.
        url = message.location.get("url", "")
        if message.type == "error" and not url.endswith("/favicon.ico"):
            console_errors.append(f"console: {message.text}" + (f" ({url})" if url else ""))

    tab.on("console", console)
    tab.on("pageerror", lambda e: console_errors.append(f"uncaught: {e}"))
    yield tab
    await context.close()

