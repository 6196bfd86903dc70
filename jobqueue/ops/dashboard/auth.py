"""Who may see the dashboard and act through it.

With a token (`JOBQUEUE_API_TOKEN`), a person types it once into the login
form; the answer is a session cookie (HttpOnly: page scripts cannot read
it; SameSite=Strict: other sites' pages do not send it; Secure unless the
dashboard is plain HTTP on this machine, `secure`) holding a random
secret. The database keeps that secret's digest under the token
(`jobqueue_sessions`) until the session expires after `SESSION_SECONDS`
or its owner logs out, so the token never sits in the browser, a logout
ends the session on every process serving the dashboard (a copied cookie
stops working with it), and a new token ends every session.

Every form that changes something also carries a CSRF token, equal to a
random cookie of the browser's own (double submit): a page of another
origin can make the browser send the cookie, but can neither read it nor
the dashboard page that holds its value. That, and `origin.cross_origin`,
guard actions with and without a login.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from starlette.requests import Request
from starlette.responses import Response

from jobqueue.ops.origin import host_name, is_loopback
from jobqueue.ops.reads import bounded
from jobqueue.schema.queries import queries

__all__ = ["CSRF_COOKIE", "CSRF_FIELD", "SESSION_COOKIE", "SESSION_SECONDS", "csrf_ok",
           "csrf_token", "end_session", "secure", "session_valid", "set_csrf_cookie",
           "start_session", "token_matches"]

SESSION_COOKIE = "jobqueue_session"
CSRF_COOKIE = "jobqueue_csrf"
#: The form field that must repeat the CSRF cookie.
CSRF_FIELD = "csrf"
#: How long a login lasts.
SESSION_SECONDS = 12 * 3600

Executor = AsyncConnection | AsyncSession


def token_matches(given: str, token: str) -> bool:
    """Compared in constant time, so the answer's timing tells nothing."""
    return hmac.compare_digest(given.encode(), token.encode())


#: What `start_session` puts in the cookie: 32 random bytes, URL-safe base64.
_SECRET = re.compile(r"[A-Za-z0-9_-]{43}")


def _digest(token: str, secret: str) -> bytes:
    return hmac.new(token.encode(), f"jobqueue dashboard session {secret}".encode(),
                    hashlib.sha256).digest()


def _secret(request: Request) -> str | None:
    """The cookie's secret, if it has the shape of one: anything else (a
    planted cookie of 5,000 digits, say) is no session, never an error."""
    value = request.cookies.get(SESSION_COOKIE, "")
    return value if _SECRET.fullmatch(value) else None


async def session_valid(request: Request, conn: Executor, token: str) -> bool:
    """Whether the request carries a session that is open under `token`."""
    secret = _secret(request)
    if secret is None:
        return False
    async with bounded(conn, request.state.read_timeout):
        found = await conn.execute(queries["session_valid"].text,
                                   {"digest": _digest(token, secret)})
        return bool(found.scalar())


def secure(request: Request) -> bool:
    """Whether the cookies get `Secure` (the browser then sends them over
    HTTPS only): when the request came over HTTPS as the server sees it
    (uvicorn's TLS, or `X-Forwarded-Proto` from a proxy `serve
    --forwarded-allow-ips` names), or when it names the server by a name
    that is not a loopback one. Such a request came across the network,
    which is only ever meant to be through a proxy that terminates TLS (the
    token is no substitute for it); behind that proxy the server itself
    sees plain HTTP, so the scheme alone left the cookies without `Secure`.
    Plain HTTP to `localhost` or `127.0.0.1` stays without it: a browser
    need not keep a Secure cookie that came over plain HTTP, even from there
    (not every one does)."""
    if request.url.scheme == "https":
        return True
    name = host_name(request.headers.get("host", ""))
    return name is not None and not is_loopback(name)


def _path(request: Request) -> str:
    """Cookies are kept to where the dashboard is mounted."""
    return str(request.scope.get("jobqueue_dashboard_root", "/")) or "/"


async def start_session(request: Request, response: Response, conn: Executor,
                        token: str) -> None:
    secret = secrets.token_urlsafe(32)
    async with conn.begin():
        await conn.execute(queries["session_start"].text,
                           {"digest": _digest(token, secret), "seconds": SESSION_SECONDS})
    response.set_cookie(SESSION_COOKIE, secret, max_age=SESSION_SECONDS, path=_path(request),
                        httponly=True, samesite="strict", secure=secure(request))


async def end_session(request: Request, response: Response, conn: Executor,
                      token: str | None) -> None:
    """Ends the session in the database, then asks the browser to forget
    it and its CSRF value."""
    secret = _secret(request)
    if secret is not None and token is not None:
        async with conn.begin():
            await conn.execute(queries["session_end"].text, {"digest": _digest(token, secret)})
    for name in (SESSION_COOKIE, CSRF_COOKIE):
        response.delete_cookie(name, path=_path(request), httponly=True, samesite="strict",
                               secure=secure(request))


def csrf_token(request: Request) -> tuple[str, bool]:
    """The browser's CSRF token, and whether it is new (then the response
    must set the cookie: `set_csrf_cookie`)."""
    given = request.cookies.get(CSRF_COOKIE, "")
    if len(given) >= 32 and given.isascii():
        return given, False
    return secrets.token_urlsafe(32), True


def set_csrf_cookie(request: Request, response: Response, value: str) -> None:
    response.set_cookie(CSRF_COOKIE, value, path=_path(request), httponly=True,
                        samesite="strict", secure=secure(request))


def csrf_ok(request: Request, form: dict[str, str]) -> bool:
    cookie = request.cookies.get(CSRF_COOKIE, "")
    return bool(cookie) and hmac.compare_digest(form.get(CSRF_FIELD, "").encode(),
                                                cookie.encode())
