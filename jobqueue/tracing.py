"""OpenTelemetry spans for jobs: one trace from the code that enqueues a job
to the handler that runs it, and the handler's own spans inside it.

With the `otel` extra installed (`opentelemetry-api`), `enqueue` and
`enqueue_many` make a PRODUCER span, `send <queue>`, and record its W3C
trace context with the job (`jobs.trace_context`, `traceparent` and
`tracestate`). The worker's run of the job is a CONSUMER span, `process
<queue>`, whose parent is that context (so the request that enqueued the job
and the job are one trace) and which links to it too, as OpenTelemetry's
messaging conventions ask; it is the current span while the handler runs, so
what the handler does through instrumented libraries (SQLAlchemy, httpx)
appears beneath it, in async and sync handlers alike. Attributes follow the
messaging semantic conventions (`messaging.system` = "jobqueue",
`messaging.destination.name` = the queue, `messaging.message.id` = the job's
id, `messaging.operation.type` = "send" or "process") with `jobqueue.*` for
the rest (job type, attempt, priority). An attempt that fails sets the span's
status to ERROR and records the exception; a retry, a snooze, a cancel and a
timeout are span events (`jobqueue.retry_scheduled`, `jobqueue.snoozed`,
`jobqueue.cancelled`, `jobqueue.timed_out`, `jobqueue.failed` when no retry
is left).

Without the package nothing is imported and nothing is spent but one test
per call. `JOBQUEUE_TRACING=off` turns it off with the package installed.
With OpenTelemetry's API alone and no tracer provider configured (the SDK's,
or a vendor's, through `trace.set_tracer_provider`) nothing is traced
either: no span is made and the worker does not read the trace contexts.

What a span cannot say: the consumer span ends when its handler does, before
the batch's commit records the outcome; a batch that then fails to commit
runs its jobs again, each in a new span.
"""

from __future__ import annotations

import json
import os
import traceback
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Link, SpanKind, StatusCode
except ImportError:  # the `otel` extra is not installed
    trace = None  # type: ignore[assignment]

from jobqueue.redact import cleaner, error_line
from jobqueue.schema.locks import CANCELLED

__all__ = ["ON", "Produced", "producing", "tracer"]

#: Whether jobs are traced: the API is importable, and not turned off.
ON: bool = trace is not None and os.environ.get("JOBQUEUE_TRACING", "").lower() not in (
    "off", "0", "false", "no")

SYSTEM = "jobqueue"
_cached: tuple[Any, Any] = (None, None)  # (provider, its tracer for jobqueue)


def tracer() -> Any | None:
    """The tracer of the configured provider, or None: no tracing (the API is
    not installed, it is turned off, or no provider was set)."""
    global _cached
    if not ON:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider):
        return None
    if _cached[0] is not provider:  # looked up again when the provider changes
        _cached = (provider, provider.get_tracer("jobqueue"))
    return _cached[1]


@dataclass
class Produced:
    """The producer span of one enqueue call, and the trace context it
    records with its jobs (JSON text for `jobs.trace_context`; None: none)."""

    span: Any
    context: str | None

    def sent(self, ids: Sequence[uuid.UUID]) -> None:
        if self.span is None:
            return
        if len(ids) == 1:
            self.span.set_attribute("messaging.message.id", str(ids[0]))
        else:
            self.span.set_attribute("messaging.batch.message_count", len(ids))


_UNTRACED = Produced(None, None)


@contextmanager
def producing(job_type: str, queue: str, count: int | None = None) -> Iterator[Produced]:
    """The span of an enqueue call (`count`: jobs of an `enqueue_many`)."""
    spans = tracer()
    if spans is None:
        yield _UNTRACED
        return
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM, "messaging.operation.type": "send",
        "messaging.operation.name": "send", "messaging.destination.name": queue,
        "jobqueue.job.type": job_type}
    if count is not None:
        attributes["messaging.batch.message_count"] = count
    with spans.start_as_current_span(f"send {queue}", kind=SpanKind.PRODUCER,
                                       attributes=attributes) as span:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        yield Produced(span, json.dumps(carrier) if carrier else None)


@dataclass
class JobSpan:
    """A job's consumer span while its handler runs, current in its context."""

    span: Any
    token: Any  # contextvars.Token of OpenTelemetry's context


#: A batch's jobs: id -> (queue, trace context), from `carriers`.
Traces = dict[uuid.UUID, tuple[str, "dict[str, str] | None"]]


def start_job(job: Any, traces: Traces) -> JobSpan | None:
    """The consumer span of one attempt of a claimed job (`worker/handler.py:
    ClaimedJob`), made current; `finish_job` ends it in the same task or
    thread."""
    queue, carrier = traces.get(job.id, ("", None))
    return start(job.id, job.job_type, job.attempt, job.priority, queue, carrier)


def finish_job(job_span: JobSpan, outcome: Any, error: BaseException | None,
               stopped: str | None, rerun: bool = False) -> None:
    """End an attempt's span by its outcome (`worker/outcome.py: Decided`;
    None: it returned, or it was not decided here: `rerun`, its batch runs it
    again, or `error`, its batch's connection was lost)."""
    if outcome is not None:
        finish(job_span, None if outcome.kind == "done" else outcome.kind, outcome.value,
               retry=outcome.retry, delay=outcome.delay, exc=error, stopped=stopped)
    elif rerun:
        finish(job_span, "rerun")
    elif error is not None:
        finish(job_span, "failed", error_line(error), exc=error)
    else:
        finish(job_span, None)


def start(job_id: uuid.UUID, job_type: str, attempt: int, priority: int,
          queue: str, carrier: dict[str, str] | None) -> JobSpan | None:
    """The consumer span of one attempt, made current (`finish` ends it, in
    the same task or thread); None when nothing traces any more."""
    spans = tracer()
    if spans is None:
        return None
    parent = propagate.extract(carrier) if carrier else None
    links = []
    if parent is not None:
        linked = trace.get_current_span(parent).get_span_context()
        if linked.is_valid:
            links.append(Link(linked))
    span = spans.start_span(
        f"process {queue}", context=parent, kind=SpanKind.CONSUMER, links=links,
        attributes={"messaging.system": SYSTEM, "messaging.operation.type": "process",
                    "messaging.operation.name": "process", "messaging.destination.name": queue,
                    "messaging.message.id": str(job_id), "jobqueue.job.type": job_type,
                    "jobqueue.job.attempt": attempt, "jobqueue.job.priority": priority})
    token = otel_context.attach(trace.set_span_in_context(span))
    return JobSpan(span, token)


def finish(job_span: JobSpan, kind: str | None, error: str | None = None, *,
           retry: bool = False, delay: float = 0.0, exc: BaseException | None = None,
           stopped: str | None = None) -> None:
    """End an attempt's span with what became of it: `kind` None for a
    success, else the outcome's kind ("failed", "snoozed"), or "rerun" (the
    batch runs it again); `stopped`: the reason a cancel or a timeout
    stopped it."""
    span = job_span.span
    try:
        if kind == "snoozed":
            span.add_event("jobqueue.snoozed", {"jobqueue.snooze_s": delay})
        elif kind == "rerun":
            span.add_event("jobqueue.rerun")
        elif kind == "failed":
            if exc is not None:  # as the job keeps it: no statement's values
                clean = cleaner(exc)
                span.record_exception(exc, attributes={
                    "exception.message": clean(str(exc)),
                    "exception.stacktrace": clean("".join(traceback.format_exception(exc)))})
            span.set_status(StatusCode.ERROR, error)
            if stopped == CANCELLED:
                span.add_event("jobqueue.cancelled")
            elif stopped is not None:
                span.add_event("jobqueue.timed_out")
            if retry:
                span.add_event("jobqueue.retry_scheduled", {"jobqueue.retry_in_s": delay})
            else:
                span.add_event("jobqueue.failed")
    finally:
        otel_context.detach(job_span.token)
        span.end()


def carriers(rows: Sequence[Any]) -> Traces:
    """`queries.sql: trace_contexts`'s rows as job id -> (queue, carrier)."""
    return {row[0]: (row[1], json.loads(row[2]) if row[2] is not None else None)
            for row in rows}
