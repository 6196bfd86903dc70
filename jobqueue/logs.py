"""The log formats' documented import path; they live in `jobqueue.ops.logs`.

    from jobqueue.logs import JsonFormatter
"""

from jobqueue.ops.logs import FORMATS, JsonFormatter, configure_logging

__all__ = ["FORMATS", "JsonFormatter", "configure_logging"]
