"""How long `jobqueue serve` waits for a request's head: a connection must
send its request line and headers within `--header-timeout` seconds (10)
of opening, or of the previous answer, or it is closed.

uvicorn has no such deadline: its keep-alive timeout starts after an
answer and stops at the first byte of the next request, and nothing at all
runs before the first. So a client that opens connections and sends a
header line now and then (slowloris) kept each one open for as long as it
liked: 20 of them were still open after 35 s, and enough of them would use
up the process's file descriptors. The deadline counts from the
connection's start, whatever trickles in meanwhile; once a head has
arrived, the request is the app's, however long it takes (`DELETE
/jobs/{id}` waits for a worker).

What this cannot do is tell many slow clients from many clients: an
attacker who opens connections faster than the deadline closes them still
holds that many. That is a reverse proxy's job (header and body timeouts,
connections per address); see the deployment page.
"""

from __future__ import annotations

import asyncio
import logging

from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["HeaderDeadline", "with_header_timeout"]

logger = logging.getLogger(__name__)


class HeaderDeadline(H11Protocol):
    """uvicorn's h11 protocol, with a deadline for each request's head
    (`with_header_timeout` makes one with its number of seconds)."""

    header_timeout: float
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start a pipelined request: `_late` sees it
        if not self.transport.is_closing():
            self._arm()  # the next request's head

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.header_timeout, self._late)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _serving(self) -> bool:
        """Whether a request whose head arrived is being answered now."""
        return self.cycle is not None and not self.cycle.response_complete

    def _late(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or self._serving() \
                or self.transport.get_protocol() is not self:  # upgraded to a WebSocket
            return
        logger.debug("closed a connection from %s that sent no request head within %g s",
                     self.client[0] if self.client else "unknown", self.header_timeout)
        self.transport.close()


def with_header_timeout(seconds: float) -> type[HeaderDeadline]:
    """The protocol class to give uvicorn (`http=`) for this deadline."""
    return type("HeaderDeadline", (HeaderDeadline,), {"header_timeout": seconds})
