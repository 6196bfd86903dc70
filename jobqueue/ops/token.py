"""The API's and the dashboard's shared secret: `JOBQUEUE_API_TOKEN`.

`FROM_ENV` (the default of `create_router`, `create_app`) means: read the
variable at each request, so a router built at import time still follows
the environment it runs in; a string is the token; None means no token.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["FROM_ENV", "TOKEN_ENV", "resolve"]

#: The environment variable that holds the bearer token (unset or empty: no token).
TOKEN_ENV = "JOBQUEUE_API_TOKEN"
FROM_ENV: Any = object()


def resolve(configured: Any) -> str | None:
    """The token in force now (None: none)."""
    return (os.environ.get(TOKEN_ENV) if configured is FROM_ENV else configured) or None
