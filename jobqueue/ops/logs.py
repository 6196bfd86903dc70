"""Logging for people and for machines: one event per line, text or JSON.

jobqueue logs through the standard `logging` module. Its events carry their
facts as structured fields (`extra=`): `event`, `job_id`, `job_type`,
`attempt`, `duration_ms`, `worker_id`, `error`, … The text format keeps them
in the message, for a terminal:

    2026-11-29 09:00:00,000 INFO jobqueue.worker: job 3f1c… (send_email) attempt 1
    completed in 1.2 ms                                      (one line, wrapped here)

A failed job's traceback is the one thing printed below its line, indented.

The JSON format writes one object per line with `ts` (ISO 8601, UTC), `level`,
`logger`, `message` and every structured field, for a log pipeline:

    {"ts": "2026-11-29T09:00:00.000+00:00", "level": "INFO", "logger": "jobqueue.worker",
     "message": "job 3f1c… (send_email) attempt 1 completed in 1.2 ms",
     "event": "job_completed", "job_id": "3f1c…", "job_type": "send_email",
     "attempt": 1, "duration_ms": 1.2, "worker_id": 8812}

`configure_logging` is what the CLI's `--log-level` and `--log-format` set;
applications that configure logging themselves can use `JsonFormatter` alone.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import IO, Any, Literal

from jobqueue.enqueue import CONTROL_CHARACTERS

LogFormat = Literal["text", "json"]
FORMATS: tuple[LogFormat, ...] = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Attributes every LogRecord has: anything else on a record came from `extra=`
# (except uvicorn's `color_message`, the message again with terminal colours).
_STANDARD = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)).keys()
) | {"message", "asctime", "taskName", "color_message"}


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields a record was given through `extra=`."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, then the fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in fields_of(record).items():
            entry.setdefault(key, value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        # default=str: a uuid, a datetime or anything else a caller passed
        # stays one line of valid JSON instead of breaking the log.
        return json.dumps(entry, ensure_ascii=False, default=str)


#: Characters a line of text output shows escaped (`\x1b`, `\u202e`): the
#: ones a job type may not hold (`enqueue.CONTROL_CHARACTERS`).
_ESCAPES = {c: f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" for c in CONTROL_CHARACTERS}
_ESCAPES_BUT_LINES = {c: e for c, e in _ESCAPES.items() if c not in (0x09, 0x0A)}


def printable(text: str, lines: bool = False) -> str:
    """`text` safe to print: control characters escaped, so what a job's
    type or its error says cannot forge a log line (a newline), rewrite the
    terminal (an escape sequence) or reorder itself (a bidi override).
    `lines`: keep newlines and tabs (a report's own layout)."""
    return text.translate(_ESCAPES_BUT_LINES if lines else _ESCAPES)


def printable_values(value: Any, key: str = "") -> Any:
    """`value` (a report: dicts, lists, text) with every text `printable`,
    before it is laid out in lines: a newline in a job type must not start a
    row of its own. A `traceback` keeps its rows (shown indented)."""
    if isinstance(value, str):
        return printable(value, lines=key == "traceback")
    if isinstance(value, dict):
        return {k: printable_values(v, k) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [printable_values(v, key) for v in value]
    return value


class TextFormatter(logging.Formatter):
    """`TEXT_FORMAT`, and a failed job's traceback (its `traceback` field)
    below the line, indented, as Python prints an exception's. What the
    message and the traceback quote is escaped (`printable`)."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        record.message = printable(record.message)
        return super().formatMessage(record)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        trace = getattr(record, "traceback", None)
        if not isinstance(trace, str) or not trace:
            return line
        return line + "\n" + "\n".join("  " + printable(row)
                                       for row in trace.rstrip().splitlines())


def formatter(fmt: LogFormat) -> logging.Formatter:
    if fmt == "json":
        return JsonFormatter()
    if fmt == "text":
        return TextFormatter()
    raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {fmt!r}")


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler `configure_logging` installs (and replaces on a second call)."""


def configure_logging(
    level: str | int = "INFO", fmt: LogFormat = "text", stream: IO[str] | None = None
) -> logging.Handler:
    """Send log records at `level` and above to `stream` (stderr) in `fmt`.

    Installs one handler on the root logger, replacing the one a previous call
    installed; handlers someone else added are left alone. Returns the handler.
    """
    handler = _Handler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter(fmt))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    return handler
