-- Every statement the queue runs, in one place.
--
-- Each query is headed `-- name --` and a one-line comment saying what it is
-- for. Parameters are bound (`:name`), never formatted in. Times come from the
-- database's clock: now() for comparisons, statement_timestamp() for what a
-- statement records (inside a batch transaction, now() is when the batch began).

-- enqueue --
-- One job, inside the caller's transaction. NULL run_at means due now.
INSERT INTO jobs (job_type, payload, max_retries, run_at)
VALUES (:job_type, CAST(:payload AS jsonb), :max_retries,
        COALESCE(CAST(:run_at AS timestamptz), now()))
RETURNING id;

-- enqueue_many --
-- Many jobs of one type in one statement; ids come back in the payloads' order.
WITH new AS (
    SELECT gen_random_uuid() AS id, payload, n
    FROM unnest(CAST(:payloads AS text[])) WITH ORDINALITY AS t(payload, n)
), inserted AS (
    INSERT INTO jobs (id, job_type, payload, max_retries, run_at)
    SELECT id, :job_type, CAST(payload AS jsonb), :max_retries,
           COALESCE(CAST(:run_at AS timestamptz), now())
    FROM new
)
SELECT id FROM new ORDER BY n;

-- claim --
-- Take up to :limit due jobs for worker :worker_id in one round trip. SKIP
-- LOCKED lets concurrent claimers pass each other instead of queueing up.
WITH due AS (
    SELECT id
    FROM jobs
    WHERE status IN ('pending', 'retrying') AND run_at <= now()
    ORDER BY run_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs AS j
SET status = 'processing', started_at = statement_timestamp(), worker_id = :worker_id
FROM due
WHERE j.id = due.id
RETURNING j.id, j.job_type, CAST(j.payload AS text) AS payload, j.retry_count, j.max_retries;

-- complete --
-- Record the successes of a batch, in the transaction that holds their
-- handlers' writes. Only jobs this worker still owns are touched: the caller
-- rolls back everything if a row is missing.
UPDATE jobs AS j
SET status = 'completed', completed_at = statement_timestamp(), next_retry_at = NULL,
    result = CAST(d.result AS jsonb)
FROM unnest(CAST(:ids AS uuid[]), CAST(:results AS text[])) AS d(id, result)
WHERE j.id = d.id AND j.status = 'processing' AND j.worker_id = :worker_id
RETURNING extract(epoch FROM j.completed_at - greatest(j.created_at, j.run_at)) AS latency;

-- fail --
-- Record failed attempts: each becomes `retrying`, due after its backoff, or
-- `failed` for good; every attempt is appended to error_history.
UPDATE jobs AS j
SET status = CASE WHEN d.retry THEN 'retrying' ELSE 'failed' END,
    retry_count = j.retry_count + CASE WHEN d.retry THEN 1 ELSE 0 END,
    next_retry_at = CASE WHEN d.retry
                         THEN statement_timestamp() + make_interval(secs => d.delay) END,
    run_at = CASE WHEN d.retry
                  THEN statement_timestamp() + make_interval(secs => d.delay)
                  ELSE j.run_at END,
    completed_at = CASE WHEN d.retry THEN NULL ELSE statement_timestamp() END,
    error_message = d.error,
    error_history = j.error_history || jsonb_build_array(jsonb_build_object(
        'attempt', j.retry_count + 1, 'error', d.error, 'at', statement_timestamp()))
FROM unnest(CAST(:ids AS uuid[]), CAST(:errors AS text[]),
            CAST(:delays AS float8[]), CAST(:retry AS boolean[])) AS d(id, error, delay, retry)
WHERE j.id = d.id AND j.status = 'processing' AND j.worker_id = :worker_id
RETURNING j.id;

-- hand_back --
-- Return claimed jobs that did not run (shutdown, a lost transaction) to the
-- queue as they were: no attempt is counted. NULL :ids means every job the
-- worker still holds.
WITH back AS (
    UPDATE jobs
    SET status = CASE WHEN retry_count > 0 THEN 'retrying' ELSE 'pending' END,
        started_at = NULL, worker_id = NULL
    WHERE status = 'processing' AND worker_id = :worker_id
      AND (CAST(:ids AS uuid[]) IS NULL OR id = ANY(CAST(:ids AS uuid[])))
    RETURNING id
)
SELECT n, CASE WHEN n > 0 THEN pg_notify('jobqueue', '') END AS notified
FROM (SELECT count(*) AS n FROM back) AS c;

-- rescue --
-- Return to the queue the jobs of workers that are gone. A live worker holds
-- an advisory lock (class :worker_lock_class, key = its id) on its own
-- connection for as long as it lives; PostgreSQL drops that lock the moment
-- the connection dies, so a missing lock means a dead worker. The live ids
-- are read from pg_locks once, not once per job.
WITH live AS MATERIALIZED (
    SELECT CAST(objid AS bigint) AS worker_id
    FROM pg_locks
    WHERE locktype = 'advisory' AND granted AND objsubid = 2
      AND classid = CAST(:worker_lock_class AS oid)
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
), back AS (
    UPDATE jobs AS j
    SET status = CASE WHEN j.retry_count > 0 THEN 'retrying' ELSE 'pending' END,
        started_at = NULL, worker_id = NULL
    WHERE j.status = 'processing'
      AND NOT EXISTS (SELECT 1 FROM live WHERE live.worker_id = j.worker_id)
    RETURNING j.id
)
SELECT n, CASE WHEN n > 0 THEN pg_notify('jobqueue', '') END AS notified
FROM (SELECT count(*) AS n FROM back) AS c;

-- register_worker --
-- A worker introduces itself; its heartbeat starts now.
INSERT INTO jobqueue_workers (id, name, mode, state)
VALUES (:id, :name, :mode, 'standby')
ON CONFLICT (id) DO UPDATE
SET name = EXCLUDED.name, mode = EXCLUDED.mode, state = 'standby',
    started_at = now(), heartbeat_at = now();

-- heartbeat --
-- "Still here", on the database clock. No row back means this worker was
-- fenced (declared hung) and must start over.
UPDATE jobqueue_workers SET heartbeat_at = now(), state = :state
WHERE id = :id
RETURNING id;

-- fence --
-- Cut off workers whose heartbeat is older than :lease seconds (hung, or on a
-- machine that vanished): terminate every backend they own, which drops
-- their locks and rolls back their open transactions, then forget them; their
-- jobs are then rescued like a dead worker's. Workers whose liveness lock is
-- already gone (crashed) are simply forgotten. The victims are chosen first,
-- in a materialized CTE: pg_terminate_backend must never run for a row that
-- merely has not been filtered out yet.
WITH live AS MATERIALIZED (
    SELECT CAST(objid AS bigint) AS worker_id
    FROM pg_locks
    WHERE locktype = 'advisory' AND granted AND objsubid = 2
      AND classid = CAST(:worker_lock_class AS oid)
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
), stale AS (
    DELETE FROM jobqueue_workers AS w
    WHERE w.id <> :self_id
      AND (w.heartbeat_at < now() - make_interval(secs => :lease)
           OR NOT EXISTS (SELECT 1 FROM live WHERE live.worker_id = w.id))
    RETURNING w.id, EXISTS (SELECT 1 FROM live WHERE live.worker_id = w.id) AS hung
), victims AS MATERIALIZED (
    SELECT s.id, a.pid
    FROM stale AS s
    JOIN pg_stat_activity AS a ON a.application_name LIKE 'jobqueue worker ' || s.id || ' %'
    WHERE s.hung AND a.datname = current_database()
)
SELECT s.id, s.hung, count(v.pid) FILTER (WHERE pg_terminate_backend(v.pid)) AS terminated
FROM stale AS s LEFT JOIN victims AS v ON v.id = s.id
GROUP BY s.id, s.hung;

-- terminate_lanes --
-- Cut the lane connections of worker :id: their open transactions roll back.
SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) AS terminated
FROM pg_stat_activity
WHERE application_name LIKE 'jobqueue worker ' || CAST(:id AS integer) || ' lane%'
  AND datname = current_database();

-- unregister_worker --
-- A worker that stops cleanly says goodbye.
DELETE FROM jobqueue_workers WHERE id = :id;

-- try_lock --
-- Take a session lock if nobody holds it: the active worker's lock, or the
-- maintenance leader's.
SELECT pg_try_advisory_lock(:lock_class, :key) AS locked;

-- prune --
-- Delete finished jobs past their retention, a bounded slice at a time.
DELETE FROM jobs
WHERE id IN (
    SELECT id FROM jobs
    WHERE completed_at < now() - make_interval(secs => :keep_completed) AND status = 'completed'
       OR completed_at < now() - make_interval(secs => :keep_failed) AND status = 'failed'
    LIMIT :limit
);

-- next_due --
-- Seconds until the earliest waiting job is due (negative: overdue; NULL: none).
SELECT extract(epoch FROM min(run_at) - now()) AS seconds
FROM jobs
WHERE status IN ('pending', 'retrying');

-- lock_worker --
-- Announce this worker as alive: a session lock on its dedicated connection.
SELECT pg_try_advisory_lock(:lock_class, :worker_id) AS locked;

-- lock_active --
-- Wait to become the one active worker; returns the moment the holder's
-- connection releases the lock or dies.
SELECT pg_advisory_lock(:lock_class, :key);

-- unlock_all --
-- Let go of every session lock this connection holds.
SELECT pg_advisory_unlock_all();

-- counts_by_status --
-- How many jobs are in each state.
SELECT status, count(*) AS n FROM jobs GROUP BY status;

-- recent_finished --
-- Finished jobs of the last :window seconds: counts and latency percentiles.
SELECT count(*) FILTER (WHERE status = 'completed') AS completed,
       count(*) FILTER (WHERE status = 'failed') AS failed,
       percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (
           ORDER BY extract(epoch FROM completed_at - greatest(created_at, run_at)))
           FILTER (WHERE status = 'completed') AS latency,
       percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (
           ORDER BY extract(epoch FROM completed_at - started_at))
           FILTER (WHERE status = 'completed') AS run_time
FROM jobs
WHERE completed_at >= now() - make_interval(secs => :window);

-- recent_failed_attempts --
-- Failed attempts recorded in the last :window seconds, from error_history.
SELECT count(*) AS n
FROM jobs AS j, jsonb_array_elements(j.error_history) AS e
WHERE (j.status IN ('pending', 'processing', 'retrying')
       OR j.completed_at >= now() - make_interval(secs => :window))
  AND CAST(e ->> 'at' AS timestamptz) >= now() - make_interval(secs => :window);

-- workers --
-- Workers that announced themselves, with their heartbeat's age.
SELECT id, name, mode, state, started_at,
       extract(epoch FROM now() - heartbeat_at) AS heartbeat_age
FROM jobqueue_workers
ORDER BY started_at;

-- get_job --
-- One job, everything about it.
SELECT id, job_type, payload, status, retry_count, max_retries, next_retry_at, run_at,
       error_message, error_history, result, created_at, started_at, completed_at, worker_id
FROM jobs
WHERE id = :id;
