"""Who may see the dashboard and act through it.

With a token (`JOBQUEUE_API_TOKEN`), a person types it once into the login
form; the answer is a session cookie (HttpOnly: page scripts cannot read
it; SameSite=Strict: other sites' pages do not send it) holding the time it
was issued and an HMAC of that time under the token, so the token itself
never sits in the browser, changing the token ends every session, and a
session ends after `SESSION_SECONDS`.

Every form that changes something also carries a CSRF token, equal to a
random cookie of the browser's own (double submit): a page of another
origin can make the browser send the cookie, but can neither read it nor
the dashboard page that holds its value. That, and `origin.cross_origin`,
guard actions with and without a login.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

from starlette.requests import Request
from starlette.responses import Response

__all__ = ["CSRF_COOKIE", "CSRF_FIELD", "SESSION_COOKIE", "SESSION_SECONDS", "csrf_ok",
           "csrf_token", "end_session", "session_valid", "set_csrf_cookie", "start_session",
           "token_matches"]

SESSION_COOKIE = "jobqueue_session"
CSRF_COOKIE = "jobqueue_csrf"
#: The form field that must repeat the CSRF cookie.
CSRF_FIELD = "csrf"
#: How long a login lasts.
SESSION_SECONDS = 12 * 3600


def token_matches(given: str, token: str) -> bool:
    """Compared in constant time, so the answer's timing tells nothing."""
    return hmac.compare_digest(given.encode(), token.encode())


def _sign(token: str, issued: int) -> str:
    return hmac.new(token.encode(), f"jobqueue dashboard session {issued}".encode(),
                    hashlib.sha256).hexdigest()


def session_valid(request: Request, token: str, now: float | None = None) -> bool:
    """Whether the request carries an unexpired session issued under `token`."""
    issued_text, _, signature = request.cookies.get(SESSION_COOKIE, "").partition(".")
    # ASCII digits, a timestamp's few: str.isdigit() takes "²" (which int()
    # refuses) and int() refuses 4,300 digits or more; either was a 500, on
    # every page and before the login.
    if not (issued_text.isascii() and issued_text.isdigit() and len(issued_text) <= 12):
        return False
    issued = int(issued_text)
    age = (time.time() if now is None else now) - issued
    return 0 <= age < SESSION_SECONDS and hmac.compare_digest(signature, _sign(token, issued))


def _path(request: Request) -> str:
    """Cookies are kept to where the dashboard is mounted."""
    return str(request.scope.get("jobqueue_dashboard_root", "/")) or "/"


def start_session(request: Request, response: Response, token: str) -> None:
    issued = int(time.time())
    response.set_cookie(SESSION_COOKIE, f"{issued}.{_sign(token, issued)}",
                        max_age=SESSION_SECONDS, path=_path(request), httponly=True,
                        samesite="strict", secure=request.url.scheme == "https")


def end_session(request: Request, response: Response) -> None:
    response.delete_cookie(SESSION_COOKIE, path=_path(request), httponly=True,
                           samesite="strict")


def csrf_token(request: Request) -> tuple[str, bool]:
    """The browser's CSRF token, and whether it is new (then the response
    must set the cookie: `set_csrf_cookie`)."""
    given = request.cookies.get(CSRF_COOKIE, "")
    if len(given) >= 32 and given.isascii():
        return given, False
    return secrets.token_urlsafe(32), True


def set_csrf_cookie(request: Request, response: Response, value: str) -> None:
    response.set_cookie(CSRF_COOKIE, value, path=_path(request), httponly=True,
                        samesite="strict", secure=request.url.scheme == "https")


def csrf_ok(request: Request, form: dict[str, str]) -> bool:
    cookie = request.cookies.get(CSRF_COOKIE, "")
    return bool(cookie) and hmac.compare_digest(form.get(CSRF_FIELD, "").encode(),
                                                cookie.encode())
