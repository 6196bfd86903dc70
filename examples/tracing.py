"""One trace from a request to the job it enqueues and the handler's own work.

    pip install 'jobqueue[otel]' opentelemetry-sdk
    export DATABASE_URL=$(jobqueue db up) && jobqueue migrate
    python examples/tracing.py

It sets up OpenTelemetry's SDK with an in-memory exporter (in production:
an OTLP exporter, or your vendor's), enqueues a job inside a span standing
for an HTTP request, runs it with a burst worker, and prints the spans as a
tree: the request, `send default` (the enqueue), `process default` (the
worker's run of the job) and the handler's own span beneath it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from jobqueue import JobRunner, enqueue, handlers
from jobqueue.db import create_engine

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("shop")


@handlers.register("send_receipt")
async def send_receipt(session: Any, payload: dict[str, Any]) -> None:
    with tracer.start_as_current_span("render receipt"):
        await asyncio.sleep(0.01)


def tree(spans: list[Any]) -> list[str]:
    """The spans as indented lines, children under their parent."""
    by_parent: dict[int | None, list[Any]] = {}
    for span in sorted(spans, key=lambda s: s.start_time):
        by_parent.setdefault(span.parent.span_id if span.parent else None, []).append(span)
    lines: list[str] = []

    def walk(parent: int | None, depth: int) -> None:
        for span in by_parent.get(parent, []):
            lines.append(f"{'  ' * depth}{span.name} ({span.kind.name.lower()})")
            walk(span.context.span_id, depth + 1)
    walk(None, 0)
    return lines


async def main() -> None:
    engine = create_engine()
    with tracer.start_as_current_span("POST /orders"):
        async with engine.begin() as conn:
            await enqueue(conn, "send_receipt", {"order_id": 42})
    await JobRunner(engine.url.render_as_string(hide_password=False), burst=True,
                    install_signal_handlers=False).run()
    await engine.dispose()
    spans = exporter.get_finished_spans()
    print(f"{len({span.context.trace_id for span in spans})} trace:")
    print("\n".join(tree(list(spans))))


if __name__ == "__main__":
    asyncio.run(main())
