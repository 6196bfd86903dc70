"""An index of jobs that failed for good, newest first to read.

The dashboard lists failed jobs by when they failed. The index of finished
jobs (`idx_jobs_finished`) holds completed and failed ones alike, and in a
table of a million completed jobs and a handful of failed ones a page of
failed jobs would walk it nearly whole. This one holds only `failed` rows:
a job enters it once, when it fails for good, so claims and completions
never write to it.

Built concurrently: writes go on while it is built (`online.py`).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

from jobqueue.schema import online

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    online.create_index("idx_jobs_failed", "jobs", ["completed_at"], where="status = 'failed'")


def downgrade() -> None:
    op.drop_index("idx_jobs_failed", table_name="jobs")
