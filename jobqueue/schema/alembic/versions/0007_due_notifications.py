"""New jobs say where they wait: queue, priority and earliest due time.

A worker's claims no longer read its queue's index from the front: each
lane remembers, for each (queue, priority), where the jobs it has not seen
yet begin (its *floor*, `jobqueue/worker/floors.py`), so a claim steps over
none of the entries left behind by jobs already finished, which vacuum may
not be able to remove for a long while. A job can land behind a floor: one
enqueued in a transaction that began before the jobs the lane just took
(its run_at is its transaction's start), or one put back in the queue as it
was. Those announce themselves: the notification on channel `jobqueue` now
carries `due:<priority>:<epoch of the earliest run_at>:<queue>`, one per
(queue, priority) an INSERT statement wrote to, and a worker lowers its
floors to it. An UPDATE that makes a job waiting and due again (`hand_back`,
a retry from the API, a change of queue or priority, a hand-written one)
announces it the same way, from a row trigger. `jobqueue_announce` builds
the payload.

The batch ledger (`jobqueue_batches`) stops overwriting one row per lane:
under a held horizon each overwrite left a version of the row that the next
lookup by its key walked past (a lane's lookup read 1 buffer, then 350
after two minutes). Each batch now inserts a row and deletes its lane's
previous one by address (`record_batch`), so its key gains the batch's
transaction id.

A floor is a (run_at, id) pair, not a time: jobs enqueued together share
their run_at (one statement, one now()), and a floor on run_at alone would
read every entry of such a batch again at each claim. So idx_jobs_pickable
gains `id` as its last column, and the claims read it in (priority DESC,
run_at, id) order. The new index is built concurrently beside the old one,
which it then replaces (`online.py`: writes go on meanwhile). Ties in
run_at then go by id, so ids now sort in the order the jobs were made
(`jobqueue_id`, laid out as a UUIDv7): jobs enqueued in one transaction
still run in the order they were enqueued, as they did when the
index left ties in the order of the rows in the table.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from jobqueue.schema import online

PICKABLE = "status IN ('pending', 'retrying')"

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Ids that sort in the order jobs were made: the clock's microsecond
    # (UUIDv7's layout: Unix milliseconds, version 7, the microseconds within
    # the millisecond), then the row's place in its statement (`n`, which
    # `enqueue_many` gives), then random bits.
    op.execute("""
        CREATE OR REPLACE FUNCTION jobqueue_id(n bigint DEFAULT 0) RETURNS uuid
        LANGUAGE sql VOLATILE AS $$
            SELECT CAST(lpad(to_hex(u / 1000), 12, '0') || '7'
                        || lpad(to_hex(u % 1000), 3, '0') || '8'
                        || lpad(to_hex((n % 268435456) * 4294967296
                                       + CAST(floor(random() * 4294967296) AS bigint)),
                                15, '0') AS uuid)
            FROM (SELECT CAST(extract(epoch FROM clock_timestamp()) * 1000000 AS bigint)
                      AS u) AS t
        $$
    """)
    op.alter_column("jobs", "id", server_default=sa.text("jobqueue_id()"))
    # A job made waiting again, due already (put back as it was, retried by
    # hand, moved to another queue or priority, set back in SQL), says where
    # it now waits, one notification per row. The WHEN clause is all the hot
    # path pays: a claim or a completion leaves no job waiting, and a retry
    # or a snooze is due later than now.
    op.execute("""
        CREATE OR REPLACE FUNCTION jobqueue_notify_back() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM jobqueue_announce(NEW.queue, NEW.priority, NEW.run_at);
            RETURN NULL;
        END
        $$
    """)
    op.execute("DROP TRIGGER IF EXISTS jobs_notify_back ON jobs")
    op.execute("""
        CREATE TRIGGER jobs_notify_back
        AFTER UPDATE ON jobs FOR EACH ROW
        WHEN (NEW.status IN ('pending', 'retrying') AND NEW.run_at <= now()
              AND (OLD.status NOT IN ('pending', 'retrying') OR NEW.run_at < OLD.run_at
                   OR NEW.queue <> OLD.queue OR NEW.priority <> OLD.priority))
        EXECUTE FUNCTION jobqueue_notify_back()
    """)
    op.execute("ALTER TABLE jobqueue_batches DROP CONSTRAINT IF EXISTS pk_jobqueue_batches")
    op.create_primary_key("pk_jobqueue_batches", "jobqueue_batches",
                          ["worker_id", "lane", "xid"])
    op.execute("""
        CREATE OR REPLACE FUNCTION jobqueue_announce(queue text, priority integer, due timestamptz)
        RETURNS void LANGUAGE sql AS $$
            SELECT pg_notify('jobqueue', 'due:' || priority || ':'
                                         || extract(epoch FROM due) || ':' || queue)
        $$
    """)
    # Still once per statement (and per queue and priority it wrote to), and
    # delivered at commit; the new rows come from the statement's transition
    # table, so a bulk insert reads its own rows once, in memory.
    op.execute("""
        CREATE OR REPLACE FUNCTION jobqueue_notify() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM jobqueue_announce(queue, priority, min(run_at))
            FROM new_jobs GROUP BY queue, priority;
            RETURN NULL;
        END
        $$
    """)
    op.execute("DROP TRIGGER IF EXISTS jobs_notify_insert ON jobs")
    op.execute("""
        CREATE TRIGGER jobs_notify_insert
        AFTER INSERT ON jobs REFERENCING NEW TABLE AS new_jobs
        FOR EACH STATEMENT EXECUTE FUNCTION jobqueue_notify()
    """)
    online.replace_index("idx_jobs_pickable", "jobs", ["queue", "priority DESC", "run_at", "id"],
                         where=PICKABLE)


def _pickable(columns: list[object]) -> None:
    op.drop_index("idx_jobs_pickable", table_name="jobs")
    op.create_index("idx_jobs_pickable", "jobs", columns, postgresql_where=sa.text(PICKABLE))


def downgrade() -> None:
    op.execute("DROP TRIGGER jobs_notify_back ON jobs")
    op.execute("DROP FUNCTION jobqueue_notify_back()")
    _pickable(["queue", sa.text("priority DESC"), "run_at"])
    op.alter_column("jobs", "id", server_default=sa.text("gen_random_uuid()"))
    op.execute("DROP FUNCTION jobqueue_id(bigint)")
    op.execute("DROP TRIGGER jobs_notify_insert ON jobs")
    op.execute("""
        CREATE OR REPLACE FUNCTION jobqueue_notify() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('jobqueue', '');
            RETURN NULL;
        END
        $$
    """)
    op.execute("""
        CREATE TRIGGER jobs_notify_insert
        AFTER INSERT ON jobs
        FOR EACH STATEMENT EXECUTE FUNCTION jobqueue_notify()
    """)
    op.execute("DROP FUNCTION jobqueue_announce(text, integer, timestamptz)")
    op.execute("DELETE FROM jobqueue_batches")  # rows of batches in flight: none once stopped
    op.drop_constraint("pk_jobqueue_batches", "jobqueue_batches", type_="primary")
    op.create_primary_key("pk_jobqueue_batches", "jobqueue_batches", ["worker_id", "lane"])
