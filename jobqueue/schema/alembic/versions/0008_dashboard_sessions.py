"""Dashboard logins live in the database, so logging out ends one.

A login used to be a cookie holding its issue time and an HMAC of it under
the token: valid wherever it was shown until it expired, 12 hours later,
whatever happened in between. Logging out only asked the browser to forget
it; a copy of the cookie (and the form's CSRF value) still paused a queue.
Now the cookie holds a random secret, and `jobqueue_sessions` holds its
digest under the token (`queries.sql: session_start`) until it expires or
its owner logs out. Every process serving the dashboard sees the same rows,
so a logout on one ends the session on all of them; a new token ends every
session, since no digest made under the old one matches.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "jobqueue_sessions",
        sa.Column("digest", sa.LargeBinary(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), server_default=sa.text("now()"),
                  nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("digest", name=op.f("pk_jobqueue_sessions")),
        if_not_exists=True,
    )


def downgrade() -> None:
    op.drop_table("jobqueue_sessions")
