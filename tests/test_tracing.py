"""OpenTelemetry: one trace from the span that enqueues a job, through the
worker's span for it, to what the handler does inside (SQLAlchemy's spans);
outcomes as statuses and events; nothing without a tracer provider. The
SDK's in-memory exporter collects the spans."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest
from opentelemetry import trace
from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.util._once import Once
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

import jobqueue
from jobqueue import HandlerRegistry, Snooze, enqueue, enqueue_many
from jobqueue.control import cancel
from jobqueue.testing import drain, wait_for

#: A value a failing statement is given (never in its job's span).
CARD = "4929730155660412"


def _set_provider(provider: Any) -> None:
    """OpenTelemetry sets its global provider once per process; its own tests
    reset it through these internals, and so do these, so that no other
    test in the process traces."""
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
    if provider is not None:
        trace.set_tracer_provider(provider)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _set_provider(provider)
    try:
        yield exporter
    finally:
        _set_provider(None)


def one(spans: InMemorySpanExporter, name: str) -> ReadableSpan:
    found = [span for span in spans.get_finished_spans() if span.name == name]
    assert len(found) == 1, [span.name for span in spans.get_finished_spans()]
    return found[0]


def events(span: ReadableSpan) -> list[str]:
    return [event.name for event in span.events]


async def test_one_trace_from_the_request_through_the_job_to_the_handlers_statements(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection, spans: InMemorySpanExporter
) -> None:
    registry = HandlerRegistry()

    @registry.register("charge")
    async def charge(session: Any, payload: dict[str, Any]) -> None:
        await session.execute(text("INSERT INTO effects (job_id) VALUES (:id)"),
                              {"id": jobqueue.current_job().id})

    tracer = trace.get_tracer("the app")
    with tracer.start_as_current_span("POST /orders"):
        async with engine.begin() as s:
            job_id = await enqueue(s, "charge", {"order_id": 1}, queue="billing")
    stored = json.loads(await conn.fetchval("SELECT trace_context FROM jobs"))
    assert set(stored) == {"traceparent"}

    # engines made from now on, the worker's; its declared range stops below
    # SQLAlchemy 2.1, which it instruments all the same
    SQLAlchemyInstrumentor().instrument(skip_dep_check=True)
    try:
        report = await drain(db_url, registry=registry, queues=["billing"])
    finally:
        SQLAlchemyInstrumentor().uninstrument()
    assert report["processed"] == 1

    request, send = one(spans, "POST /orders"), one(spans, "send billing")
    process = one(spans, "process billing")
    assert send.kind is SpanKind.PRODUCER and process.kind is SpanKind.CONSUMER
    assert send.parent.span_id == request.context.span_id
    assert process.parent.span_id == send.context.span_id  # one trace
    assert process.context.trace_id == request.context.trace_id
    assert [link.context.span_id for link in process.links] == [send.context.span_id]
    assert stored["traceparent"].split("-")[2] == f"{send.context.span_id:016x}"
    assert dict(process.attributes) == {
        "messaging.system": "jobqueue", "messaging.operation.type": "process",
        "messaging.operation.name": "process", "messaging.destination.name": "billing",
        "messaging.message.id": str(job_id), "jobqueue.job.type": "charge",
        "jobqueue.job.attempt": 1, "jobqueue.job.priority": 0}
    assert send.attributes["messaging.message.id"] == str(job_id)
    assert process.status.status_code is StatusCode.UNSET
    statements = [span for span in spans.get_finished_spans()
                  if span.attributes.get("db.statement", "").startswith("INSERT INTO effects")]
    assert len(statements) == 1 and statements[0].parent.span_id == process.context.span_id


async def test_outcomes_show_as_statuses_and_events(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection, spans: InMemorySpanExporter
) -> None:
    registry = HandlerRegistry()
    started = asyncio.Event()

    @registry.register("flaky")
    async def flaky(session: Any, payload: dict[str, Any]) -> None:
        raise RuntimeError("card declined")

    @registry.register("later")
    async def later(session: Any, payload: dict[str, Any]) -> None:
        raise Snooze(600)

    @registry.register("slow", timeout=0.2)
    async def slow(session: Any, payload: dict[str, Any]) -> None:
        await asyncio.sleep(30)

    @registry.register("stuck")
    async def stuck(session: Any, payload: dict[str, Any]) -> None:
        started.set()
        await asyncio.sleep(30)

    async with engine.begin() as s:
        await enqueue(s, "flaky", max_retries=1)
        await enqueue(s, "later")
        await enqueue(s, "slow", max_retries=0)
        stuck_id = await enqueue(s, "stuck", queue="other")
    await drain(db_url, registry=registry, queues=["default"])

    runs = {span.attributes["jobqueue.job.type"]: span for span in spans.get_finished_spans()
            if span.name == "process default"}
    flaky_run = runs["flaky"]
    assert flaky_run.status.status_code is StatusCode.ERROR
    assert "card declined" in str(flaky_run.status.description)
    assert events(flaky_run) == ["exception", "jobqueue.retry_scheduled"]
    assert events(runs["later"]) == ["jobqueue.snoozed"]
    assert runs["later"].status.status_code is StatusCode.UNSET
    assert events(runs["slow"])[-2:] == ["jobqueue.timed_out", "jobqueue.failed"]

    worker = asyncio.create_task(drain(db_url, registry=registry, queues=["other"]))
    await asyncio.wait_for(started.wait(), 30)
    async with engine.begin() as c:
        await cancel(c, stuck_id)
    await asyncio.wait_for(worker, 30)
    cancelled = one(spans, "process other")
    assert cancelled.status.status_code is StatusCode.ERROR
    assert events(cancelled)[-2:] == ["jobqueue.cancelled", "jobqueue.failed"]


@pytest.mark.parametrize("form", ["async", "sync"])
async def test_a_failed_span_keeps_the_error_not_the_statements_values(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection, spans: InMemorySpanExporter,
    form: str
) -> None:
    """The exception event and the status say what the job's error says:
    the class, SQLSTATE and message, not the values the statement was given
    (`redact.py`)."""
    await conn.execute("CREATE TABLE cards (card text PRIMARY KEY)")
    await conn.execute("INSERT INTO cards VALUES ($1)", CARD)
    insert = text("INSERT INTO cards (card) VALUES (:card)")
    registry = HandlerRegistry()

    @registry.register("store_async")
    async def store_async(session: Any, payload: dict[str, Any]) -> None:
        await session.execute(insert, {"card": CARD})

    @registry.register("store_sync")
    def store_sync(session: Any, payload: dict[str, Any]) -> None:
        session.execute(insert, {"card": CARD})

    async with engine.begin() as s:
        await enqueue(s, f"store_{form}", max_retries=0)
    await drain(db_url, registry=registry)
    run = one(spans, "process default")
    [exception] = [event for event in run.events if event.name == "exception"]
    assert exception.attributes["exception.type"] == "sqlalchemy.exc.IntegrityError"
    assert "Traceback" in exception.attributes["exception.stacktrace"]
    shown = [str(run.status.description), str(exception.attributes["exception.message"]),
             str(exception.attributes["exception.stacktrace"])]
    for said in shown:
        assert 'violates unique constraint "cards_pkey" (SQLSTATE 23505)' in said
        assert CARD not in said


async def test_enqueue_many_is_one_producer_span_and_a_sync_handler_is_traced_too(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection, spans: InMemorySpanExporter
) -> None:
    registry = HandlerRegistry()

    @registry.register("resize")
    def resize(session: Any, payload: dict[str, Any]) -> None:
        with trace.get_tracer("the app").start_as_current_span("resize work"):
            pass

    async with engine.begin() as s:
        await enqueue_many(s, "resize", [{"n": 1}, {"n": 2}])
    send = one(spans, "send default")
    assert send.attributes["messaging.batch.message_count"] == 2
    contexts = await conn.fetch("SELECT DISTINCT trace_context::text FROM jobs")
    assert len(contexts) == 1 and contexts[0][0] is not None

    await drain(db_url, registry=registry)
    runs = [span for span in spans.get_finished_spans() if span.name == "process default"]
    work = [span for span in spans.get_finished_spans() if span.name == "resize work"]
    assert len(runs) == 2 and len(work) == 2
    assert {span.parent.span_id for span in runs} == {send.context.span_id}
    assert {span.parent.span_id for span in work} == {span.context.span_id for span in runs}


async def test_without_a_tracer_provider_nothing_is_traced_or_recorded(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection
) -> None:
    registry = HandlerRegistry()
    seen: list[bool] = []

    @registry.register("plain")
    async def plain(session: Any, payload: dict[str, Any]) -> None:
        seen.append(trace.get_current_span().get_span_context().is_valid)

    assert jobqueue.tracing.tracer() is None  # the API alone: a proxy provider
    async with engine.begin() as s:
        await enqueue(s, "plain")
    assert await conn.fetchval("SELECT trace_context FROM jobs") is None
    await drain(db_url, registry=registry)
    assert seen == [False]


async def test_a_job_enqueued_without_a_trace_still_gets_a_span_of_its_own(
    engine: AsyncEngine, db_url: str, spans: InMemorySpanExporter
) -> None:
    registry = HandlerRegistry()

    @registry.register("plain")
    async def plain(session: Any, payload: dict[str, Any]) -> None:
        pass

    async with engine.begin() as s:
        await s.execute(text("INSERT INTO jobs (job_type) VALUES ('plain')"))
    await drain(db_url, registry=registry)

    async def finished() -> bool:
        return any(span.name == "process default" for span in spans.get_finished_spans())
    await wait_for(finished, timeout=10, message="the job's span")
    run = one(spans, "process default")
    assert run.parent is None and run.links == ()
