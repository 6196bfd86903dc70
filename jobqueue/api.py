"""The HTTP API's documented import path; it lives in `jobqueue.ops.api`.

    from jobqueue.api import create_router
    from jobqueue import api; app.include_router(api.router)
"""

from jobqueue.ops.api import (
    DEFAULT_MAX_BODY_BYTES,
    TOKEN_ENV,
    create_app,
    create_router,
    get_connection,
    router,
)

__all__ = ["DEFAULT_MAX_BODY_BYTES", "TOKEN_ENV", "create_app", "create_router",
           "get_connection", "router"]
