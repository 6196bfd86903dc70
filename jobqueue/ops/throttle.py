"""How many wrong tokens a client may try: a brake on guessing.

A token of 16 characters or more (`token.check`) cannot be guessed at any
rate, but a short one could, and the API answered 523 wrong tries a second.
Each client (its address as the server sees it: `jobqueue serve` takes no
`X-Forwarded-For` unless told which proxies to trust) may present
`FAILURES` wrong tokens in `WINDOW` seconds; after that every try, right or
wrong, is a 429 until the oldest of them leaves the window, so a guess that
would have been right tells nothing. Only a token presented and wrong
counts: a request without one is no guess. The count lives in the process
(each `serve` process keeps its own).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from starlette.requests import Request

__all__ = ["FAILURES", "WINDOW", "Throttle", "client_address"]

#: Wrong tokens a client may present within `WINDOW` seconds.
FAILURES = 10
WINDOW = 60.0
#: Clients remembered at most; past it the longest-known are forgotten.
MAX_CLIENTS = 10_000


class Throttle:
    def __init__(self, failures: int = FAILURES, window: float = WINDOW,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.failures, self.window, self.clock = failures, window, clock
        self._seen: dict[str, deque[float]] = {}

    def wait(self, client: str) -> float:
        """Seconds before `client` may try again (0: now)."""
        times = self._seen.get(client)
        if not times:
            return 0.0
        now = self.clock()
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self._seen[client]
            return 0.0
        return times[0] + self.window - now if len(times) >= self.failures else 0.0

    def failed(self, client: str) -> None:
        """A wrong token from `client`."""
        times = self._seen.setdefault(client, deque(maxlen=self.failures))
        times.append(self.clock())
        while len(self._seen) > MAX_CLIENTS:
            del self._seen[next(iter(self._seen))]


def client_address(request: Request) -> str:
    """Who a request comes from, as the server sees it."""
    return request.client.host if request.client else "unknown"
