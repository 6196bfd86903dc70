"""How long a failed job waits before its next attempt."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter and a cap.

    The n-th retry (n = 1, 2, …) waits base * factor**(n-1) seconds, at most
    `cap`, then scaled by a random factor in [1 - jitter, 1]. Jitter spreads
    retries of jobs that failed together (an outage) so they do not all come
    back at the same instant. The defaults give the seed's 1 s, 2 s, 4 s, …
    """

    base: float = 1.0
    factor: float = 2.0
    cap: float = 300.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if self.base < 0 or self.cap < 0:
            raise ValueError("backoff base and cap must not be negative")
        if self.factor < 1:
            raise ValueError("backoff factor must be at least 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("backoff jitter must be between 0 and 1")

    def delay(self, retry_number: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number `retry_number` (1 for the first)."""
        exponent = max(retry_number - 1, 0)
        # Cap the exponent before computing, so a large retry count cannot overflow.
        raw = self.base * self.factor ** min(exponent, 64) if self.factor > 1 else self.base
        capped = min(raw, self.cap)
        spread = (rng or random).uniform(1 - self.jitter, 1) if self.jitter else 1.0
        return capped * spread
