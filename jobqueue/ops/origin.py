"""Refusing requests that another web site makes a browser send.

Two tricks, two guards. *Cross-origin requests* (below). And *DNS
rebinding*: a site whose name the attacker makes resolve to 127.0.0.1 is,
to the browser, the same origin as itself, so `Origin` and `Host` agree and
the origin check passes; only the `Host` header still says which name the
browser meant. `HostGuard` answers only to expected names: loopback ones
(`localhost`, `127.0.0.1`, `[::1]`) when the app has no token, any when it
has one (the token is what a rebinding page cannot send), or the names it
is given. The routes `create_router` makes apply the same rule themselves
(`RouteHosts`): the app that mounts them has middleware of its own, and an
app whose routes ask for no token is as open to a rebinding page as
`serve` would be.

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

import ipaddress
from collections.abc import Sequence
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["ANY_HOST", "SAFE_METHODS", "HostGuard", "HostRule", "RouteHosts", "cross_origin",
           "host_name", "is_loopback"]

#: `allowed_hosts` that lets every Host through (an app with a token).
ANY_HOST = "*"

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


def is_loopback(host: str) -> bool:
    """Whether `host` (an address, `localhost`, or a Host header's name)
    names this machine only."""
    host = host.strip("[]").rstrip(".").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def host_name(header: str) -> str | None:
    """The name in a Host header, without its port (None: unreadable)."""
    try:
        name = urlsplit(f"//{header}").hostname
    except ValueError:  # a bad port, an unclosed bracket
        return None
    return None if name is None else name.rstrip(".")


class HostRule:
    """Which machines a request may say it is for, by its Host header.
    `allowed`: None, loopback names only; else names (any case), `*.domain`
    for its subdomains, or `ANY_HOST`. A request without a Host header
    (HTTP/1.0, never a browser) passes."""

    def __init__(self, allowed: Sequence[str] | None = None) -> None:
        self.any = allowed is not None and ANY_HOST in allowed
        self.names = {a.lower().rstrip(".") for a in allowed or () if not a.startswith("*.")}
        self.suffixes = tuple(a.lower()[1:] for a in allowed or () if a.startswith("*."))
        self.loopback_only = allowed is None

    def allows(self, header: str | None) -> bool:
        if header is None or self.any:
            return True
        name = host_name(header)
        if name is None:
            return False
        if self.loopback_only:
            return is_loopback(name)
        name = name.lower()
        return name in self.names or name.endswith(self.suffixes)


#: The rule without a token: what a rebinding page's request cannot pass.
LOOPBACK_NAMES = HostRule(None)
#: The rule when every request must authenticate.
ANY_NAME = HostRule([ANY_HOST])


def host_header(scope: Scope) -> str | None:
    return next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), None)


class RouteHosts:
    """The Host rule of `create_router`'s routes, which an app of its own
    mounts without `HostGuard` (its middleware is not ours): the names
    given; else any name while requests must authenticate (the token in
    force, or the app's own `auth` dependency: what a rebinding page cannot
    send), loopback names while nothing does, as `jobqueue serve` does."""

    def __init__(self, allowed: Sequence[str] | None = None, own_auth: bool = False) -> None:
        self.given = None if allowed is None else HostRule(allowed)
        self.own_auth = own_auth

    def refusal(self, scope: Scope, token: str | None) -> str | None:
        """Why this request is refused (a 400, the name not echoed); None: go on."""
        rule = self.given or (ANY_NAME if token is not None or self.own_auth
                              else LOOPBACK_NAMES)
        if rule.allows(host_header(scope)):
            return None
        if rule.loopback_only:
            return ("these routes do not answer to that host name: without a token or an "
                    "auth dependency they answer to loopback names only (create_router's "
                    "allowed_hosts names others)")
        return "these routes do not answer to that host name (create_router's allowed_hosts)"


class HostGuard:
    """ASGI middleware: a request whose Host names another machine than the
    ones expected (`HostRule`) gets a 400 before anything else runs (the
    name is not echoed)."""

    def __init__(self, app: ASGIApp, allowed: Sequence[str] | None = None) -> None:
        self.app = app
        self.rule = HostRule(allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and not self.rule.allows(host_header(scope)):
            answer = ("this server does not answer to that host name: without a token it "
                      "answers to loopback names only (see --allowed-host)"
                      if self.rule.loopback_only else
                      "this server does not answer to that host name (see --allowed-host)")
            await JSONResponse({"detail": answer}, status_code=400)(scope, receive, send)
            return
        await self.app(scope, receive, send)
