"""Reading a request's body: at most so many bytes, before anything parses
it, and a client that goes away half-way is nobody's error.

The API and the dashboard's forms read their bodies here rather than let
the framework read them whole: a body past the limit is refused as soon
as it passes it, however it is sent (`Content-Length` or chunks). A client
that closes its connection before sending what it announced made
Starlette raise `ClientDisconnect` through the route, an 80-line traceback
in the server's log for each; it is a line at DEBUG now.
"""

from __future__ import annotations

import logging

from starlette.requests import ClientDisconnect, Request

from jobqueue.ops.throttle import client_address

__all__ = ["Gone", "TooLarge", "read"]

logger = logging.getLogger(__name__)


class TooLarge(Exception):
    """The body passed the limit."""


class Gone(Exception):
    """The client closed its connection before sending the whole body."""


async def read(request: Request, limit: int) -> bytes:
    """The whole body: TooLarge as soon as it passes `limit` bytes, Gone if
    the client leaves first."""
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise TooLarge
            chunks.append(chunk)
    except ClientDisconnect:
        logger.debug("client %s went away before sending its whole body (%s)",
                     client_address(request), request.url.path)
        raise Gone from None
    return b"".join(chunks)
