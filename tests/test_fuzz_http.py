"""No input reaches a 500 (issue 31): the dashboard's query parameters,
page links (cursors), path parts, forms and cookies, and the API's query
parameters, fed hostile values from a seeded generator, against the real
app and database. A failure names the request, so it can be replayed.

The values are built from pieces that broke parsers here or elsewhere:
Unicode digits that `str.isdigit()` takes and `int()` refuses, numbers past
int4/int8 and past `int()`'s digit limit, times whose UTC leaves the years
1-9999, NUL, invalid UTF-8 and lone surrogates (percent-encoded, as a
browser or curl can send them), control and bidi characters, JSON nested
thousands deep, base64 that is not, and very long values.
"""

from __future__ import annotations

import base64
import json
import random
import re
from collections.abc import AsyncIterator, Callable
from urllib.parse import quote

import httpx
import pytest

TOKEN = "fuzz-token-0123456789"
SEED = 31
CSRF = re.compile(r'name="csrf" value="([^"]+)"')

#: Pieces as they go on the wire (already percent-encoded where they must be).
PIECES = [
    "", "0", "-1", "1", "49", "2147483648", "9223372036854775808", "9" * 40, "9" * 5000,
    "%C2%B2", "%D9%A3",  # superscript two, Arabic-Indic three: isdigit(), not int()
    "%00", "%FF", "%ED%A0%80", "%C0%AF", "%F0%9F%92%A9", "%0A", "%0D%0A", "%1B%5B31m",
    "%E2%80%AE", "%3Cscript%3E", "%27", "%22", "%5C", "%25", "%2F", "..", "%2E%2E",
    "0001-01-01T00:00:00%2B14:00", "9999-12-31T23:59:59-14:00", "0001-01-01",
    "2026-13-40T99:99", "2026-12-05T10:00", "2026-12-05T10:00:00Z", "NaN", "-Infinity",
    "1e999", "null", "true", "%5B%5D", "%7B%7D", "waiting", "running", "failed", "completed",
    "pending", "processing", "retrying", "default", "emails", "q:1.x-y_z",
    "01a2461d-9f6c-7142-8000-000031ab4df9", "ffffffff-ffff-ffff-ffff-ffffffffffff",
    "%20", "+", "a" * 65, "t" * 101,
]


def _json_value(rng: random.Random, depth: int = 0) -> str:
    """A JSON text, as a hand-written one could be: ints past any width,
    escapes PostgreSQL cannot store, nesting past Python's recursion."""
    kind = rng.randrange(10 if depth < 3 else 6)
    if kind == 0:
        return rng.choice(["0", "-1", "2147483648", "1" + "0" * 400, "1e400", "-0.0"])
    if kind == 1:
        return rng.choice(['"\\u0000"', '"\\ud800"', '"\\u202e"', '"x"', '""',
                           '"0001-01-01T00:00:00+14:00"', '"9999-12-31T23:59:59-14:00"',
                           '"2026-12-05T10:00:00+00:00"', '"default"', '"a:b"',
                           '"01a2461d-9f6c-7142-8000-000031ab4df9"', '"not-a-uuid"'])
    if kind in (2, 3):
        return rng.choice(["null", "true", "false", "NaN", "Infinity"])
    if kind in (4, 5):
        return "[" * 5000 + "]" * 5000 if rng.random() < 0.3 else '{"a": 1}'
    return "[" + ",".join(_json_value(rng, depth + 1)
                          for _ in range(rng.randrange(6))) + "]"


def _cursor(rng: random.Random) -> str:
    """A page link's cursor: base64 of JSON (ours have this shape), or not."""
    roll = rng.random()
    if roll < 0.2:
        return rng.choice(PIECES)
    raw = _json_value(rng).encode()
    if roll < 0.3:
        raw = raw[: rng.randrange(len(raw) + 1)]  # cut short
    text = base64.urlsafe_b64encode(raw).decode()
    return text.rstrip("=") if rng.random() < 0.7 else text + "!!"


def _value(rng: random.Random) -> str:
    parts = [rng.choice(PIECES) for _ in range(rng.randrange(1, 4))]
    return "".join(parts)[:12_000]


@pytest.fixture
async def logged_in(make_client: Callable[..., httpx.AsyncClient]
                    ) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """A client logged in to the dashboard (with a token: the whole guard
    runs), and its CSRF value."""
    async with make_client(token=TOKEN) as web:
        csrf = CSRF.search((await web.get("/dashboard/login")).text).group(1)  # type: ignore[union-attr]
        assert (await web.post("/dashboard/login",
                               data={"csrf": csrf, "token": TOKEN})).status_code == 303
        yield web, csrf


async def _no_500(web: httpx.AsyncClient, method: str, url: str, **kw: object) -> int:
    answer = await web.request(method, httpx.URL(url), **kw)  # type: ignore[arg-type]
    assert answer.status_code < 500, f"{method} {url} {kw} -> {answer.status_code}"
    return answer.status_code


async def test_the_dashboards_query_strings_and_paths(
        logged_in: tuple[httpx.AsyncClient, str]) -> None:
    web, _ = logged_in
    rng = random.Random(SEED)
    statuses: dict[int, int] = {}
    for _ in range(400):
        params = {name: _value(rng) for name in ("status", "queue", "type", "before", "done")
                  if rng.random() < 0.5}
        if rng.random() < 0.8:
            params["after"] = _cursor(rng)
            params.setdefault("status", rng.choice(["waiting", "running", "failed",
                                                    "completed"]))
        query = "&".join(f"{k}={v}" for k, v in params.items())
        path = rng.choice(["/dashboard/jobs", "/dashboard/jobs", "/", "/dashboard/overview",
                           f"/dashboard/jobs/{_value(rng) or 'x'}"])
        code = await _no_500(web, "GET", f"http://localhost{path}?{query}")
        statuses[code] = statuses.get(code, 0) + 1
    # Something to check: the generator reached the lists and their refusals.
    assert statuses.get(200, 0) > 20 and statuses.get(400, 0) > 50, statuses


async def test_the_dashboards_forms_and_action_paths(
        logged_in: tuple[httpx.AsyncClient, str]) -> None:
    web, csrf = logged_in
    rng = random.Random(SEED + 1)
    for _ in range(150):
        action = rng.choice([f"/dashboard/jobs/{_value(rng) or 'x'}/retry",
                             f"/dashboard/jobs/{_value(rng) or 'x'}/cancel",
                             f"/dashboard/queues/{_value(rng) or 'x'}/pause",
                             f"/dashboard/queues/{_value(rng) or 'x'}/resume"])
        fields = [("csrf", csrf if rng.random() < 0.8 else quote(_value(rng)))]
        fields += [(rng.choice(["reason", "token", "x", "csrf"]), _value(rng))
                   for _ in range(rng.randrange(3))]
        body = "&".join(f"{k}={v}" for k, v in fields)
        await _no_500(web, "POST", f"http://localhost{action}", content=body.encode(),
                      headers={"content-type": "application/x-www-form-urlencoded"})


async def test_cookies_before_and_after_the_login(
        make_client: Callable[..., httpx.AsyncClient]) -> None:
    """A page on another port of the same host can plant any cookie."""
    rng = random.Random(SEED + 2)
    async with make_client(token=TOKEN) as web:
        for _ in range(150):
            session = _value(rng) if rng.random() < 0.7 else _cursor(rng)
            csrf = _value(rng)
            cookie = f"jobqueue_session={session}; jobqueue_csrf={csrf}".encode()
            if rng.random() < 0.3:
                cookie += b"; jobqueue_session=\xb2\xff"  # raw bytes, not UTF-8
            path = rng.choice(["/", "/dashboard/login", "/dashboard/jobs",
                               "/dashboard/overview"])
            method = rng.choice(["GET", "GET", "POST"])
            target = "/dashboard/login" if method == "POST" else path
            code = await _no_500(web, method, f"http://localhost{target}",
                                 headers={"cookie": cookie},
                                 content=f"csrf={csrf}&token={_value(rng)}".encode())
            assert code in (200, 303, 401, 403, 429), (target, code)


async def test_the_apis_query_strings(client: httpx.AsyncClient) -> None:
    rng = random.Random(SEED + 3)
    for _ in range(250):
        params = {name: _value(rng) for name in ("status", "job_type", "queue", "limit")
                  if rng.random() < 0.5}
        if rng.random() < 0.6:
            params["before"] = _cursor(rng)
        query = "&".join(f"{k}={v}" for k, v in params.items())
        path = rng.choice(["/jobs", "/jobs", f"/jobs/{_value(rng) or 'x'}", "/queues"])
        await _no_500(client, "GET", f"http://localhost{path}?{query}")
        if rng.random() < 0.2:
            await _no_500(client, "DELETE", f"http://localhost/jobs/{_value(rng) or 'x'}"
                                            f"?reason={_value(rng)}")


def test_the_generator_makes_what_it_promises() -> None:
    """The pieces that found the 500s of issue 31 are in what it sends."""
    rng = random.Random(SEED)
    cursors = []
    for c in (_cursor(rng) for _ in range(400)):
        try:
            cursors.append(base64.urlsafe_b64decode(c + "=" * (-len(c) % 4)))
        except ValueError:  # one of the pieces, or the ones spoilt on purpose
            pass
    assert any(c.startswith(b"[[[[[") and len(c) > 9000 for c in cursors)
    assert any(b"\\ud800" in c for c in cursors) and any(b"1" + b"0" * 400 in c for c in cursors)
    values = [_value(rng) for _ in range(400)]
    assert any("%C2%B2" in v for v in values) and any("%2B14:00" in v for v in values)
    assert json.loads('"\\ud800"') == "\ud800"  # what a cursor's JSON can carry
