"""Workers announce themselves and beat a heartbeat, so hung ones can be fenced.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "jobqueue_workers",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("mode", sa.String(length=20), nullable=False),
        sa.Column("state", sa.String(length=20), server_default=sa.text("'standby'"),
                  nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), server_default=sa.text("now()"),
                  nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), server_default=sa.text("now()"),
                  nullable=False),
        sa.CheckConstraint("mode IN ('exclusive', 'shared')",
                           name=op.f("ck_jobqueue_workers_mode")),
        sa.CheckConstraint("state IN ('standby', 'active', 'shared')",
                           name=op.f("ck_jobqueue_workers_state")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobqueue_workers")),
    )


def downgrade() -> None:
    op.drop_table("jobqueue_workers")
