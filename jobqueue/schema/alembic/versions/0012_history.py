"""The history: finished jobs leave the `jobs` table for one partitioned by day.

A finished job is read now and then (by id, in the dashboard's lists, in
the last minutes' figures) and never written again, but while it stays in
`jobs` every vacuum of the queue's table walks it, every whole-table read
pays for it, and retention has to delete it row by row. So the
maintenance leader moves finished jobs, a slice at a time, into
`jobqueue_history` (`queries.sql`: `archive`), and retention drops a whole
day of them at once (`history_expired`, `jobqueue_history_drop`):

- `jobqueue_history`: the columns of `jobs`, partitioned by status
  (`jobqueue_history_completed`, `jobqueue_history_failed`, so each status
  keeps its own retention), each of them by day of `completed_at` (UTC):
  `jobqueue_history_completed_20261206` holds the jobs completed that day.
  The leader adds a day's partitions before it moves jobs into them
  (`jobqueue_history_add`), creating each table apart and attaching it, a
  step that takes no lock readers or writers of the history wait for.
- An index on id, to find a job, and one on (completed_at, id), for the
  lists: every partition has both. A lookup by id is told the day the job
  was made (`jobqueue_id_floor`: the time in a `jobqueue_id`, a day early
  to be safe) and reads only the partitions from then on.
- `jobqueue_history_counts`: how many jobs each day's partitions hold, by
  status, queue and type, kept by the statements that move jobs in and out,
  so the operator's counts of finished jobs are exact and cost a few rows.
- `jobqueue_all_jobs`: `jobs` and the history as one, for the reads that
  must find a job wherever it is, and for people writing SQL of their own.

Nothing here touches `jobs`: the migration is instant whatever the table
holds. The jobs already finished in it move to the history once workers of
this release run (10,000 per tick).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STATUSES = ("completed", "failed")


def upgrade() -> None:
    # Where a job's history can start: the millisecond a jobqueue_id was
    # made (its first 48 bits, as in UUIDv7), a day early for a clock that
    # stepped back; any other id (gen_random_uuid(), from before 0007)
    # could be anywhere. Arithmetic on numbers only, so truly immutable:
    # partition pruning evaluates it before it reads a partition.
    op.execute("""
        CREATE OR REPLACE FUNCTION jobqueue_id_floor(id uuid) RETURNS timestamptz
        LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
            SELECT CASE WHEN substr(CAST(id AS text), 15, 1) = '7'
                   THEN to_timestamp((CAST(CAST('x' || lpad(substr(CAST(id AS text), 1, 8)
                                                          || substr(CAST(id AS text), 10, 4),
                                                          16, '0') AS bit(64)) AS bigint)
                                      - 86400000) / 1000.0)
                   ELSE CAST('-infinity' AS timestamptz) END
        $$
    """)
    op.execute("CREATE TABLE IF NOT EXISTS jobqueue_history "
               "(LIKE jobs INCLUDING CONSTRAINTS) PARTITION BY LIST (status)")
    for status in STATUSES:
        op.execute(f"CREATE TABLE IF NOT EXISTS jobqueue_history_{status} "
                   f"PARTITION OF jobqueue_history FOR VALUES IN ('{status}') "
                   "PARTITION BY RANGE (completed_at)")
    op.execute("CREATE INDEX IF NOT EXISTS idx_jobqueue_history_id ON jobqueue_history (id)")
    op.execute("CREATE INDEX IF NOT EXISTS idx_jobqueue_history_finished "
               "ON jobqueue_history (completed_at, id)")
    op.execute("""
        CREATE TABLE IF NOT EXISTS jobqueue_history_counts (
            status varchar(20) NOT NULL,
            day date NOT NULL,
            queue jobqueue_queue_name NOT NULL,
            job_type varchar(100) NOT NULL,
            n bigint NOT NULL,
            CONSTRAINT pk_jobqueue_history_counts PRIMARY KEY (status, day, queue, job_type)
        )
    """)
    # The partitions of day `day` (UTC), one per status, if missing. Each is
    # made as a table of its own and then attached: ATTACH PARTITION takes
    # a SHARE UPDATE EXCLUSIVE lock on its parent, which reads and writes
    # pass, where CREATE TABLE ... PARTITION OF would wait for (and block)
    # them all.
    op.execute("""
        CREATE OR REPLACE FUNCTION jobqueue_history_add(day date) RETURNS integer
        LANGUAGE plpgsql AS $$
        DECLARE
            status text;
            part text;
            made integer := 0;
        BEGIN
            FOREACH status IN ARRAY ARRAY['completed', 'failed'] LOOP
                part := format('jobqueue_history_%s_%s', status, to_char(day, 'YYYYMMDD'));
                CONTINUE WHEN to_regclass(part) IS NOT NULL;
                EXECUTE format('CREATE TABLE %I (LIKE jobqueue_history_%s INCLUDING CONSTRAINTS)',
                               part, status);
                -- The bounds as ISO text with their offset, whatever the
                -- session's DateStyle and TimeZone.
                EXECUTE format('ALTER TABLE jobqueue_history_%s ATTACH PARTITION %I '
                               'FOR VALUES FROM (%L) TO (%L)', status, part,
                               to_char(day, 'YYYY-MM-DD') || ' 00:00:00+00',
                               to_char(day + 1, 'YYYY-MM-DD') || ' 00:00:00+00');
                made := made + 1;
            END LOOP;
            RETURN made;
        END
        $$
    """)
    # Retention: the partition of `status` for day `day` goes, and its
    # counts with it, in one transaction. DROP TABLE needs its parent's
    # ACCESS EXCLUSIVE lock for a moment: it gives up after :lock_timeout
    # instead of queueing the history's readers behind a long one.
    op.execute("""
        CREATE OR REPLACE FUNCTION jobqueue_history_drop(status text, day date,
                                                         wait text DEFAULT '200ms')
        RETURNS boolean
        LANGUAGE plpgsql AS $$
        DECLARE
            part text := format('jobqueue_history_%s_%s', status, to_char(day, 'YYYYMMDD'));
        BEGIN
            PERFORM set_config('lock_timeout', wait, true);
            DELETE FROM jobqueue_history_counts AS c WHERE c.status = $1 AND c.day = $2;
            IF to_regclass(part) IS NULL THEN
                RETURN false;
            END IF;
            EXECUTE format('DROP TABLE IF EXISTS %I', part);
            RETURN true;
        END
        $$
    """)
    op.execute("CREATE OR REPLACE VIEW jobqueue_all_jobs AS "
               "SELECT * FROM jobs UNION ALL SELECT * FROM jobqueue_history")


def downgrade() -> None:
    # Finished jobs come back to `jobs` before the history goes.
    op.execute("INSERT INTO jobs SELECT * FROM jobqueue_history")
    op.execute("DROP VIEW IF EXISTS jobqueue_all_jobs")
    op.execute("DROP FUNCTION IF EXISTS jobqueue_history_drop(text, date, text)")
    op.execute("DROP FUNCTION IF EXISTS jobqueue_history_add(date)")
    op.execute("DROP TABLE IF EXISTS jobqueue_history_counts")
    op.execute("DROP TABLE IF EXISTS jobqueue_history")
    op.execute("DROP FUNCTION IF EXISTS jobqueue_id_floor(uuid)")
