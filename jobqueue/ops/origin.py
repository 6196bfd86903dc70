"""Refusing requests that another web site makes a browser send.

Without a token the API and the dashboard listen on loopback only, but any
page the user opens can still make their browser POST to
`http://127.0.0.1:8000/jobs/…/retry` (a plain form needs no permission).
Browsers say where such a request comes from: `Sec-Fetch-Site` (every
current browser) and `Origin` (on every cross-origin POST). A request that
changes something is refused when either says it comes from elsewhere —
another port of the same host included, which is "same-site" to a cookie
but another origin. Clients that are not browsers send neither header and
are not affected.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.requests import Request

__all__ = ["SAFE_METHODS", "cross_origin"]

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def cross_origin(request: Request) -> bool:
    """Whether this request changes something and a browser says it was
    sent on behalf of another origin."""
    if request.method in SAFE_METHODS:
        return False
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        return True
    origin = request.headers.get("origin")
    if origin is None:
        return False
    if origin == "null":  # a sandboxed frame, a file: page, a redirect across origins
        return True
    return urlsplit(origin).netloc.lower() != request.headers.get("host", "").lower()
