"""Jobs carry the trace context of the code that enqueued them.

With OpenTelemetry installed (the `otel` extra), `enqueue` records the W3C
trace context of its producer span (`traceparent`, and `tracestate` when
there is one) in `trace_context`, and the worker's span for the job
continues that trace (`jobqueue/tracing.py`). NULL otherwise: the column
costs nothing to jobs that have none.

Adding a nullable column without a default changes the catalog only: no
rewrite, an ACCESS EXCLUSIVE lock held for a moment (under the migrations'
lock timeout, `online.py`: behind a long transaction on the table, the
revision gives up and tries again rather than queue every enqueue behind it).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS trace_context jsonb")


def downgrade() -> None:
    op.execute("ALTER TABLE jobs DROP COLUMN trace_context")
