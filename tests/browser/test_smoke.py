"""The harness against what `jobqueue serve` has without the dashboard: its
schema, read by a real browser, and the bearer token that guards it."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from tests.browser.conftest import PHONE, Serve, Served

if TYPE_CHECKING:
    from playwright.async_api import Page


@pytest.mark.parametrize("viewport", [PHONE], ids=["phone"])
async def test_the_browser_reads_the_schema_jobqueue_serve_serves(
        served: Served, page: Page, console_errors: list[str]) -> None:
    response = await page.goto(f"{served.url}/openapi.json")
    assert response is not None and response.status == 200
    schema = json.loads(await page.locator("body").inner_text())  # Chromium shows JSON as text
    assert schema["info"]["title"] == "jobqueue" and "/jobs" in schema["paths"]
    assert await page.evaluate("window.innerWidth") == PHONE["width"]
    assert console_errors == []


async def test_with_a_token_the_page_is_refused_without_it(
        serve: Serve, page: Page, console_errors: list[str]) -> None:
    served = await serve(token="s3cret-smoke-token")
    refused = await page.goto(f"{served.url}/openapi.json")
    assert refused is not None and refused.status == 401
    assert "bearer token" in await page.locator("body").inner_text()
    assert any("401" in e for e in console_errors)  # the browser logged the refusal
    console_errors.clear()

    await page.set_extra_http_headers({"Authorization": f"Bearer {served.token}"})
    allowed = await page.goto(f"{served.url}/openapi.json")
    assert allowed is not None and allowed.status == 200
    assert "/jobs" in json.loads(await page.locator("body").inner_text())["paths"]
    assert console_errors == []
