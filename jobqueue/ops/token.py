"""The API's and the dashboard's shared secret: `JOBQUEUE_API_TOKEN`.

`FROM_ENV` (the default of `create_router`, `create_app`) means: read the
variable at each request, so a router built at import time still follows
the environment it runs in; a string is the token; None means no token.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["FROM_ENV", "MIN_LENGTH", "TOKEN_ENV", "check", "resolve"]

#: The environment variable that holds the bearer token (unset or empty: no token).
TOKEN_ENV = "JOBQUEUE_API_TOKEN"
FROM_ENV: Any = object()


def resolve(configured: Any) -> str | None:
    """The token in force now (None: none)."""
    return (os.environ.get(TOKEN_ENV) if configured is FROM_ENV else configured) or None


#: Shortest token accepted: anything shorter could be guessed.
MIN_LENGTH = 16


def check(token: str | None) -> str | None:
    """The token, or a ValueError when it is too short to be a secret."""
    if token is not None and len(token) < MIN_LENGTH:
        raise ValueError(f"{TOKEN_ENV} is {len(token)} characters long; use at least "
                         f"{MIN_LENGTH}, for example the output of `openssl rand -hex 32`")
    return token
