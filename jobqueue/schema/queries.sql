-- Every statement the queue runs, in one place.
--
-- Each query is headed `-- name --` and a one-line comment saying what it is
-- for. Parameters are bound (`:name`), never formatted in. Times come from the
-- database's clock: now() for comparisons, statement_timestamp() for what a
-- statement records (inside a batch transaction, now() is when the batch began).

-- enqueue --
-- One job, inside the caller's transaction. NULL run_at means due now. With a
-- unique key already held by an unfinished job, nothing is written and no row
-- comes back (the partial unique index decides, so concurrent enqueues of one
-- key cannot both insert; a second one waits for the first to commit or roll
-- back). `find_unique` then names the job that holds the key. NULL :timeout:
-- none of its own (the worker then applies its type's default, if any).
-- :trace_context: the enqueuing span's W3C context (`tracing.py`), or NULL.
INSERT INTO jobs (job_type, payload, max_retries, run_at, queue, priority, unique_key, timeout,
                  trace_context)
VALUES (:job_type, CAST(:payload AS jsonb), :max_retries,
        COALESCE(CAST(:run_at AS timestamptz), now()), :queue, :priority, :unique_key,
        CAST(:timeout AS float8), CAST(:trace_context AS jsonb))
ON CONFLICT (unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('pending', 'processing', 'retrying')
    DO NOTHING
RETURNING id;

-- find_unique --
-- The unfinished job holding a unique key (in a statement of its own, so it
-- sees a holder that committed while `enqueue` waited for it).
SELECT id FROM jobs
WHERE unique_key = :unique_key AND status IN ('pending', 'processing', 'retrying');

-- enqueue_many --
-- Many jobs of one type in one statement; ids come back in the payloads' order,
-- and sort in it (`jobqueue_id`): with one run_at, they run in that order.
WITH new AS (
    SELECT jobqueue_id(n) AS id, payload, n
    FROM unnest(CAST(:payloads AS text[])) WITH ORDINALITY AS t(payload, n)
), inserted AS (
    INSERT INTO jobs (id, job_type, payload, max_retries, run_at, queue, priority, timeout,
                      trace_context)
    SELECT id, :job_type, CAST(payload AS jsonb), :max_retries,
           COALESCE(CAST(:run_at AS timestamptz), now()), :queue, :priority,
           CAST(:timeout AS float8), CAST(:trace_context AS jsonb)
    FROM new
)
SELECT id FROM new ORDER BY n;

-- trace_contexts --
-- The queue and enqueuing trace context of a batch's jobs, read only when the
-- worker traces (`tracing.py`): the claim statements do not carry them, so
-- a worker that does not trace pays nothing for them.
SELECT id, queue, trace_context::text FROM jobs WHERE id = ANY(CAST(:ids AS uuid[]));

-- claim --
-- Take up to :limit due jobs of queue :queue for worker :worker_id and commit
-- at once, so they show `processing` while a long batch runs. One arm per
-- (job type, priority): the types the lane has handlers for, at each
-- priority the queue has (:arm_types and :priorities, highest priority
-- first, and within one the type whose floor is oldest), each a range of
-- idx_jobs_pickable, whose entries go by type, read in (run_at, id) order
-- from where the lane's last claim there stopped (:floors and :floor_ids,
-- the same length; NULL: from the start). So a claim never steps over the
-- jobs of types it cannot run, however many wait (another service's), nor
-- over the entries of jobs already taken, which vacuum may not have
-- removed yet (`worker/floors.py`). Within a priority a batch is filled
-- type by type, oldest floor first: close to due order across types, not
-- exactly it (the batch itself runs in due order). The outer LIMIT stops
-- the arms as soon as it has enough: a lower arm is not even started, and no
-- row is locked that is not returned. SKIP LOCKED lets concurrent claimers
-- pass each other instead of queueing up. A queue that is paused or limited
-- (a row in jobqueue_queues says so) gives nothing here: its jobs go through
-- `claim_limited`. That check runs once per statement (an InitPlan, one probe
-- of a small table), so queues without settings pay nothing else for them.
-- Jobs that must run alone (`run_alone`) are left to `claim_alone`.
--
-- Each job's row address comes back too (`tid`, the version this claim
-- wrote), for `complete_claimed` to find it by.
-- Each job's run_at comes as microseconds since 1970 (`due_us`: exact, and
-- a bigint costs the worker a tenth of what decoding a timestamp does; it
-- needs the time only when a batch gives jobs back, `ClaimedJob.run_at`).
-- Each row also says where the lane's next claim in its priority may start
-- (`floor`, `floor_id`; `take`, whose batches are large, says it on the
-- last row of each priority only): the first job there that this statement did not
-- take and that is still waiting in its snapshot — one locked by someone
-- else (another lane, a caller of wait(), a batch of another worker), or the
-- next in line — or now() when there is none due. Every job before it is taken,
-- finished, or not this worker's to take; one that shows up there later (a
-- transaction that began earlier commits, a job is put back) announces
-- itself (`jobqueue_announce`) and the worker lowers the floor. An arm that
-- claimed nothing says it too, on a row of its own with no job, after the
-- jobs (`arm`): one more probe per such arm and claim, an empty claim's
-- included. Without it a type with nothing waiting (a worker's other
-- handlers) had no floor, and every claim read its range from the start:
-- over the entries of every job of that type finished while vacuum is held
-- back, and over every other type's too when the planner reads the arm in
-- idx_jobs_waiting (queue, priority, run_at: across types), as it does when
-- one type is all there is. At 500 jobs/s with the horizon pinned, p50
-- went from 2.5 ms to 35 ms in two minutes that way. The `arm` list says
-- `priority >= -2147483648`, always true: without it the planner costs a
-- generic plan at ten arms (it cannot see the arrays), each with its probe,
-- twice a custom plan's, and plans every claim anew (0.4 ms a claim: a lone
-- job's latency ×1.1-1.2 at 100 jobs/s); a condition it cannot estimate
-- counts a third of them, and the generic plan is kept.
--
-- The claim commits without waiting for its WAL to reach the disk
-- (synchronous_commit off for its own transaction, `set_config(..., true)`:
-- PostgreSQL applies the setting in force when a transaction commits). A
-- claim lost in a server crash only leaves its job waiting, and the job's
-- completion, which waits for the disk, flushes the claim's record with its own.
WITH arm AS (
    SELECT job_type, priority, coalesce(at, '-infinity') AS at,
           coalesce(id, '00000000-0000-0000-0000-000000000000') AS id
    FROM unnest(CAST(:arm_types AS text[]), CAST(:priorities AS integer[]),
                CAST(:floors AS timestamptz[]), CAST(:floor_ids AS uuid[]))
         AS f(job_type, priority, at, id)
    WHERE f.priority >= -2147483648  -- always true: see above
), due AS MATERIALIZED (
    SELECT t.id, t.job_type, t.priority
    FROM arm AS a CROSS JOIN LATERAL (
        SELECT id, job_type, priority, run_at
        FROM jobs
        WHERE queue = :queue AND job_type = a.job_type AND priority = a.priority
          AND status IN ('pending', 'retrying')
          AND (run_at, id) >= (a.at, a.id) AND run_at <= now() AND NOT run_alone
          AND NOT EXISTS (SELECT 1 FROM jobqueue_queues AS q
                          WHERE q.name = :queue
                            AND (q.paused OR q.concurrency IS NOT NULL
                                 OR q.rate_limit IS NOT NULL))
        ORDER BY run_at, id
        LIMIT :limit
        FOR UPDATE SKIP LOCKED) AS t
    LIMIT :limit
), next AS MATERIALIZED (
    SELECT a.job_type, a.priority,
           (a.job_type, a.priority) IN (SELECT job_type, priority FROM due) AS took,
           CASE WHEN w.run_at <= now() THEN w.run_at ELSE now() END AS floor,
           CASE WHEN w.run_at <= now() THEN w.id END AS floor_id
    FROM arm AS a LEFT JOIN LATERAL (
        SELECT run_at, id FROM jobs
        WHERE queue = :queue AND job_type = a.job_type AND priority = a.priority
          AND status IN ('pending', 'retrying')
          AND (run_at, id) >= (a.at, a.id) AND NOT run_alone
          AND id NOT IN (SELECT id FROM due)  -- hashed: one probe a row
        ORDER BY run_at, id
        LIMIT 1) AS w ON true
), claimed AS (
    UPDATE jobs AS j
    SET status = 'processing', started_at = statement_timestamp(), worker_id = :worker_id
    FROM due
    WHERE j.id = due.id
      AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off'
    RETURNING j.id, j.job_type, CAST(j.payload AS text) AS payload, j.retry_count,
              j.max_retries, j.timeout, j.priority, j.run_at, j.ctid
)
SELECT id, job_type, payload, retry_count, max_retries, timeout, priority, due_us,
       floor, floor_id, tid
FROM (
    SELECT false AS arm, c.id, c.job_type, c.payload, c.retry_count, c.max_retries, c.timeout,
           c.priority, CAST(extract(epoch FROM c.run_at) * 1000000 AS bigint) AS due_us,
           n.floor, n.floor_id, c.ctid AS tid
    FROM claimed AS c JOIN next AS n ON n.job_type = c.job_type AND n.priority = c.priority
    UNION ALL  -- the arms that claimed nothing: only where their next claim starts
    SELECT true, NULL, n.job_type, NULL, NULL, NULL, NULL, n.priority, NULL,
           n.floor, n.floor_id, NULL
    FROM next AS n WHERE NOT n.took) AS r
ORDER BY arm, priority DESC, due_us, id;

-- take --
-- Lock up to :limit due jobs inside the batch's own transaction without
-- writing them: a quick batch is claimed, run and recorded in one transaction,
-- one new row version per job instead of two. The lock keeps other workers
-- off until the commit; a crash rolls back and releases them untouched.
-- What it may take is what `claim` may, read the same way (arms, floors, the
-- same gate), and says where the next claim may start as `claim` does, on
-- the last row of each priority only (NULL on the others: a timestamp cost
-- the worker about 1.5 µs to decode, once per job of a 1,000-job batch).
-- Each row also carries the transaction's id (`xid`, the same on every row:
-- a subquery without references, run once, when the first row is out, so an
-- empty take assigns none), which the lane writes with the ids in
-- `jobqueue_batches` (`record_batch`) before it runs them.
WITH arm AS (
    SELECT job_type, priority, coalesce(at, '-infinity') AS at,
           coalesce(id, '00000000-0000-0000-0000-000000000000') AS id
    FROM unnest(CAST(:arm_types AS text[]), CAST(:priorities AS integer[]),
                CAST(:floors AS timestamptz[]), CAST(:floor_ids AS uuid[]))
         AS f(job_type, priority, at, id)
    WHERE f.priority >= -2147483648  -- always true: see above
), taken AS MATERIALIZED (
    SELECT t.*
    FROM arm AS a CROSS JOIN LATERAL (
        SELECT id, job_type, payload, retry_count, max_retries, timeout, priority, run_at, ctid
        FROM jobs
        WHERE queue = :queue AND job_type = a.job_type AND priority = a.priority
          AND status IN ('pending', 'retrying')
          AND (run_at, id) >= (a.at, a.id) AND run_at <= now() AND NOT run_alone
          AND NOT EXISTS (SELECT 1 FROM jobqueue_queues AS q
                          WHERE q.name = :queue
                            AND (q.paused OR q.concurrency IS NOT NULL
                                 OR q.rate_limit IS NOT NULL))
        ORDER BY run_at, id
        LIMIT :limit
        FOR UPDATE SKIP LOCKED) AS t
    LIMIT :limit
), next AS MATERIALIZED (
    SELECT a.job_type, a.priority, l.id AS last_id,
           CASE WHEN w.run_at <= now() THEN w.run_at ELSE now() END AS floor,
           CASE WHEN w.run_at <= now() THEN w.id END AS floor_id
    FROM arm AS a
    LEFT JOIN LATERAL (  -- the arm's last job taken (none: NULL, the arm took nothing)
        SELECT id FROM taken
        WHERE job_type = a.job_type AND priority = a.priority
        ORDER BY run_at DESC, id DESC
        LIMIT 1) AS l ON true
    LEFT JOIN LATERAL (
        SELECT run_at, id FROM jobs
        WHERE queue = :queue AND job_type = a.job_type AND priority = a.priority
          AND status IN ('pending', 'retrying')
          AND (run_at, id) >= (a.at, a.id) AND NOT run_alone
          AND id NOT IN (SELECT id FROM taken)  -- hashed: one probe a row
        ORDER BY run_at, id
        LIMIT 1) AS w ON true
)
SELECT id, job_type, payload, retry_count, max_retries, timeout, priority, due_us,
       floor, floor_id, tid, xid
FROM (
    SELECT false AS arm, t.id, t.job_type, CAST(t.payload AS text) AS payload, t.retry_count,
           t.max_retries, t.timeout, t.priority,
           CAST(extract(epoch FROM t.run_at) * 1000000 AS bigint) AS due_us,
           CASE WHEN t.id = n.last_id THEN n.floor END AS floor,
           CASE WHEN t.id = n.last_id THEN n.floor_id END AS floor_id, t.ctid AS tid,
           (SELECT CAST(CAST(pg_current_xact_id() AS text) AS bigint)) AS xid
    FROM taken AS t
    JOIN next AS n ON n.job_type = t.job_type AND n.priority = t.priority
    UNION ALL  -- the arms that took nothing: only where their next claim starts
    SELECT true, NULL, n.job_type, NULL, NULL, NULL, NULL, n.priority, NULL,
           n.floor, n.floor_id, NULL, NULL
    FROM next AS n WHERE n.last_id IS NULL) AS r
ORDER BY arm, priority DESC, due_us, id;

-- lock_queue --
-- Admission to a limited queue, one claimer at a time fleet-wide: held until
-- the claim commits, so the next claimer's `claim_limited` (a new statement,
-- a new snapshot) counts the jobs this one started.
SELECT pg_advisory_xact_lock(:lock_class, hashtext(:queue));

-- claim_limited --
-- `claim` for a queue with settings, after `lock_queue` in the same
-- transaction: no more than its concurrency limit running (jobs `processing`
-- in it, on every worker) and no more than its rate limit started in the
-- current window of rate_period seconds (aligned to the clock); nothing at
-- all while it is paused or if its row is gone. The window's count is kept on
-- the queue's row; started_at and the window come from the same clock
-- reading, so the database's own timestamps show the limit kept. It reads
-- the arms `claim` reads (:arm_types, :priorities), each from the front.
WITH q AS (
    SELECT concurrency, rate_limit,
           to_timestamp(floor(extract(epoch FROM statement_timestamp()) / rate_period)
                        * rate_period) AS window_now,
           window_start, window_count
    FROM jobqueue_queues
    WHERE name = :queue AND NOT paused
), room AS (
    SELECT greatest(0, least(
        :limit,
        q.concurrency - (SELECT count(*) FROM jobs WHERE status = 'processing'
                                                     AND queue = :queue),
        q.rate_limit - CASE WHEN q.window_start = q.window_now THEN q.window_count
                            ELSE 0 END)) AS n
    FROM q
), due AS (
    SELECT t.id
    FROM unnest(CAST(:arm_types AS text[]), CAST(:priorities AS integer[]))
         AS a(job_type, priority)
    CROSS JOIN LATERAL (
        SELECT id FROM jobs
        WHERE queue = :queue AND job_type = a.job_type AND priority = a.priority
          AND status IN ('pending', 'retrying') AND run_at <= now() AND NOT run_alone
        ORDER BY run_at, id
        LIMIT coalesce((SELECT n FROM room), 0)
        FOR UPDATE SKIP LOCKED) AS t
    LIMIT coalesce((SELECT n FROM room), 0)
), claimed AS (
    UPDATE jobs AS j
    SET status = 'processing', started_at = statement_timestamp(), worker_id = :worker_id
    FROM due
    WHERE j.id = due.id
    RETURNING j.id, j.job_type, CAST(j.payload AS text) AS payload, j.retry_count,
              j.max_retries, j.timeout, j.priority,
              CAST(extract(epoch FROM j.run_at) * 1000000 AS bigint) AS due_us,
              CAST(NULL AS timestamptz) AS floor, CAST(NULL AS uuid) AS floor_id,
              CAST(NULL AS tid) AS tid
), counted AS (
    UPDATE jobqueue_queues AS s
    SET window_start = q.window_now,
        window_count = CASE WHEN s.window_start = q.window_now THEN s.window_count ELSE 0 END
                       + (SELECT count(*) FROM claimed)
    FROM q
    WHERE s.name = :queue AND s.rate_limit IS NOT NULL
      AND EXISTS (SELECT 1 FROM claimed)
)
SELECT * FROM claimed;

-- waiting_queues --
-- Each (queue, job type, priority) with waiting jobs of the worker's types
-- (:job_types), its earliest run_at, and when that is due (seconds from now;
-- negative: overdue). A loose index scan of idx_jobs_pickable: one probe per
-- (queue, job type, priority) that has jobs, of any type, never a pass over
-- the jobs themselves, however many wait — but each probe starts at the
-- front of its range, and while vacuum is held back it steps over every
-- entry of a job finished since. So a worker reads it only to find what it
-- does not know yet (`floors.py`: when a life begins, then once every
-- DISCOVER_INTERVAL); in between it looks past its floors (`waiting_after`).
WITH RECURSIVE g AS (
    (SELECT queue, job_type, priority, run_at FROM jobs
     WHERE status IN ('pending', 'retrying')
     ORDER BY queue, job_type, priority DESC, run_at LIMIT 1)
    UNION ALL
    SELECT n.queue, n.job_type, n.priority, n.run_at
    FROM g, LATERAL (
        (SELECT queue, job_type, priority, run_at FROM jobs
         WHERE status IN ('pending', 'retrying') AND queue = g.queue
           AND job_type = g.job_type AND priority < g.priority
         ORDER BY queue, job_type, priority DESC, run_at LIMIT 1)
        UNION ALL
        (SELECT queue, job_type, priority, run_at FROM jobs
         WHERE status IN ('pending', 'retrying') AND queue = g.queue AND job_type > g.job_type
         ORDER BY queue, job_type, priority DESC, run_at LIMIT 1)
        UNION ALL
        (SELECT queue, job_type, priority, run_at FROM jobs
         WHERE status IN ('pending', 'retrying') AND queue > g.queue
         ORDER BY queue, job_type, priority DESC, run_at LIMIT 1)
        LIMIT 1) AS n
)
SELECT queue, job_type, priority, run_at,
       CAST(extract(epoch FROM run_at - now()) AS float8) AS due_in
FROM g
WHERE job_type = ANY(CAST(:job_types AS text[]))
ORDER BY queue, priority DESC, job_type;

-- waiting_after --
-- `waiting_queues` for the (queue, job type, priority) places a worker
-- knows, each read from its floor (:floors, :floor_ids; NULL: from the
-- start; the lowest of the worker's lanes): one probe of idx_jobs_pickable
-- per place, past what is finished. A place with nothing waiting gives no row.
SELECT f.queue, f.job_type, f.priority, w.run_at,
       CAST(extract(epoch FROM w.run_at - now()) AS float8) AS due_in
FROM unnest(CAST(:queues AS text[]), CAST(:arm_types AS text[]),
            CAST(:priorities AS integer[]), CAST(:floors AS timestamptz[]),
            CAST(:floor_ids AS uuid[]))
    AS f(queue, job_type, priority, at, id)
CROSS JOIN LATERAL (
    SELECT run_at FROM jobs
    WHERE queue = f.queue AND job_type = f.job_type AND priority = f.priority
      AND status IN ('pending', 'retrying')
      AND (run_at, id) >= (coalesce(f.at, '-infinity'),
                           coalesce(f.id, '00000000-0000-0000-0000-000000000000'))
    ORDER BY run_at, id
    LIMIT 1) AS w
ORDER BY f.queue, f.priority DESC, f.job_type;

-- queue_settings --
-- Every queue someone configured (paused, or limited). Tiny: read whole.
SELECT name, paused, concurrency, rate_limit, rate_period FROM jobqueue_queues;

-- retake --
-- Lock given jobs again, if still waiting and due (a quick batch that could
-- not commit is rerun one job per transaction; meanwhile another worker may
-- have tried one and scheduled its retry for later), with the transaction's
-- id as `take` gives it.
SELECT id, job_type, CAST(payload AS text) AS payload, retry_count, max_retries, timeout,
       priority, CAST(extract(epoch FROM run_at) * 1000000 AS bigint) AS due_us,
       CAST(NULL AS timestamptz) AS floor, CAST(NULL AS uuid) AS floor_id,
       ctid AS tid, (SELECT CAST(CAST(pg_current_xact_id() AS text) AS bigint)) AS xid
FROM jobs
WHERE id = ANY(CAST(:ids AS uuid[])) AND status IN ('pending', 'retrying')
  AND run_at <= now()
FOR UPDATE SKIP LOCKED;

-- job_savepoint --
-- Before a handler's first statement: its writes from here on can be undone
-- alone. Never released (the next job's nests inside it); the batch's commit
-- commits them all. Sent as a simple query: one round trip, nothing prepared.
SAVEPOINT jobqueue_job;

-- job_rollback --
-- A handler failed: undo its writes (back to the newest `job_savepoint`, its
-- own), keep its batch-mates'.
ROLLBACK TO SAVEPOINT jobqueue_job;

-- complete --
-- Record the successes of a batch, in the transaction that holds their
-- handlers' writes. :taken means this transaction took the jobs (`take`):
-- they are still waiting and locked by it. Otherwise only jobs this worker
-- claimed and still owns are touched: the caller rolls back everything if a
-- row is missing. Returns each job's latency (from enqueue or due time). A
-- completed job has no error_message: the errors of its earlier attempts
-- stay in error_history (a cancelled job retried and completed showed
-- `cancelled`).
-- `told`: a job that a caller of `jobqueue.wait()` waits for (a row in
-- jobqueue_waiters) is announced on channel jobqueue_done, at commit. The
-- first EXISTS is an InitPlan, run once per statement: when nobody waits it
-- is one look at an empty table, and the per-row probe never runs. (In
-- RETURNING rather than a CTE, which would copy every row through a
-- tuplestore for the rare waiter.)
UPDATE jobs AS j
SET status = 'completed', completed_at = statement_timestamp(), next_retry_at = NULL,
    result = CAST(d.result AS jsonb), worker_id = :worker_id, error_message = NULL,
    started_at = CASE WHEN :taken THEN now() ELSE j.started_at END
FROM unnest(CAST(:ids AS uuid[]), CAST(:results AS text[])) AS d(id, result)
WHERE j.id = d.id
  AND CASE WHEN :taken THEN j.status IN ('pending', 'retrying')
           ELSE j.status = 'processing' AND j.worker_id = :worker_id END
RETURNING CAST(extract(epoch FROM j.completed_at - greatest(j.created_at, j.run_at))
               AS float8) AS latency,
          CASE WHEN EXISTS (SELECT FROM jobqueue_waiters)
                    AND EXISTS (SELECT FROM jobqueue_waiters AS w WHERE w.job_id = j.id)
               THEN pg_notify('jobqueue_done', CAST(j.id AS text)) END AS told;

-- complete_taken --
-- `complete` for a quick batch (`take`), each job found at the row version
-- `take` locked (:tids): nobody else can change it before this transaction
-- ends, so it is still there, and one heap fetch a job finds it (a TID scan
-- per row of the list). Not by id: matched with the list, the planner may
-- read the rows through idx_jobs_pickable or all of the table instead, and
-- while vacuum is held back that index holds an entry for every job waiting
-- since, dead to everyone but not yet removable, which its statistics do not
-- count; the batches' completion then grew with the pin (20-120 ms a batch
-- at 500 jobs/s after 5 minutes, each time an ANALYZE tipped the plan). A
-- job whose row this transaction changed itself (a handler that updated its
-- own job) is not at its old address any more and comes back missing: the
-- lane records it with `complete`. Returns each job found, as `complete` does.
-- :tids comes as the text of a tid[] (`completer.tid_array`), and :results
-- is NULL when no handler returned anything: unnest pads it with NULLs,
-- and the worker encodes one array less.
UPDATE jobs AS j
SET status = 'completed', completed_at = statement_timestamp(), next_retry_at = NULL,
    result = CAST(d.result AS jsonb), worker_id = :worker_id, started_at = now(),
    error_message = NULL
FROM unnest(CAST(:ids AS uuid[]), CAST(:results AS text[]),
            CAST(CAST(:tids AS text) AS tid[])) AS d(id, result, tid)
WHERE j.ctid = d.tid AND j.id = d.id
RETURNING j.id,
          CAST(extract(epoch FROM j.completed_at - greatest(j.created_at, j.run_at))
               AS float8) AS latency,
          CASE WHEN EXISTS (SELECT FROM jobqueue_waiters)
                    AND EXISTS (SELECT FROM jobqueue_waiters AS w WHERE w.job_id = j.id)
               THEN pg_notify('jobqueue_done', CAST(j.id AS text)) END AS told;

-- complete_claimed --
-- `complete` for claimed jobs, each found at the row version its claim wrote
-- (:tids, from `claim`), if this worker still owns it there. Not by id: a
-- claimed job is also in idx_jobs_processing (worker_id, partial on
-- `processing`), which the planner takes for `complete`'s ownership check
-- (`worker_id = :worker_id`, estimated one row), and while vacuum is held
-- back that index keeps an entry for every job the worker has claimed
-- since: at 500 jobs/s, each arriving alone and so claimed, a lone job's
-- completion read 150,000 dead entries after five minutes (10 ms, p99 ×1.9
-- in a two-minute pin; issue 49). The ownership check is written as a CASE,
-- which no index can answer and which does not imply that index's
-- predicate: as plain conditions, the planner read a batch's rows through
-- idx_jobs_processing all the same, and its Tid Scan only for the ids. A job
-- whose row moved since its claim (a handler that updated its own job,
-- anyone else's update) comes back missing, and the lane records it with
-- `complete`, by id. Returns each job found, as `complete_taken` does.
UPDATE jobs AS j
SET status = 'completed', completed_at = statement_timestamp(), next_retry_at = NULL,
    result = CAST(d.result AS jsonb), error_message = NULL
FROM unnest(CAST(:ids AS uuid[]), CAST(:results AS text[]),
            CAST(CAST(:tids AS text) AS tid[])) AS d(id, result, tid)
WHERE j.ctid = d.tid AND j.id = d.id
  AND CASE WHEN j.status = 'processing' THEN j.worker_id = :worker_id END
RETURNING j.id,
          CAST(extract(epoch FROM j.completed_at - greatest(j.created_at, j.run_at))
               AS float8) AS latency,
          CASE WHEN EXISTS (SELECT FROM jobqueue_waiters)
                    AND EXISTS (SELECT FROM jobqueue_waiters AS w WHERE w.job_id = j.id)
               THEN pg_notify('jobqueue_done', CAST(j.id AS text)) END AS told;

-- fail --
-- Record failed attempts (:taken as in `complete`): each becomes `retrying`,
-- due after its backoff, or `failed` for good; every attempt is appended to
-- error_history, with its traceback when it has one (NULL: none). The waiters of a job failed for good are told as in
-- `complete` (a job that will be retried has not finished).
UPDATE jobs AS j
SET status = CASE WHEN d.retry THEN 'retrying' ELSE 'failed' END,
    retry_count = j.retry_count + CASE WHEN d.retry THEN 1 ELSE 0 END,
    next_retry_at = CASE WHEN d.retry
                         THEN statement_timestamp() + make_interval(secs => d.delay) END,
    run_at = CASE WHEN d.retry
                  THEN statement_timestamp() + make_interval(secs => d.delay)
                  ELSE j.run_at END,
    completed_at = CASE WHEN d.retry THEN NULL ELSE statement_timestamp() END,
    started_at = CASE WHEN :taken THEN now() ELSE j.started_at END,
    worker_id = :worker_id,
    error_message = d.error,
    error_history = j.error_history || jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
        'attempt', j.retry_count + 1, 'error', d.error, 'at', statement_timestamp(),
        'traceback', d.trace)))
FROM unnest(CAST(:ids AS uuid[]), CAST(:errors AS text[]), CAST(:delays AS float8[]),
            CAST(:retry AS boolean[]), CAST(:traces AS text[]))
     AS d(id, error, delay, retry, trace)
WHERE j.id = d.id
  AND CASE WHEN :taken THEN j.status IN ('pending', 'retrying')
           ELSE j.status = 'processing' AND j.worker_id = :worker_id END
RETURNING j.id,
          CASE WHEN NOT d.retry AND EXISTS (SELECT FROM jobqueue_waiters)
                    AND EXISTS (SELECT FROM jobqueue_waiters AS w WHERE w.job_id = j.id)
               THEN pg_notify('jobqueue_done', CAST(j.id AS text)) END AS told;

-- snooze --
-- Jobs whose handlers asked to run again later (`Snooze`): due after their
-- delay, waiting as they were before the attempt, which is not counted
-- (:taken as in `complete`).
UPDATE jobs AS j
SET status = CASE WHEN j.retry_count > 0 THEN 'retrying' ELSE 'pending' END,
    run_at = statement_timestamp() + make_interval(secs => d.delay),
    started_at = NULL, worker_id = NULL
FROM unnest(CAST(:ids AS uuid[]), CAST(:delays AS float8[])) AS d(id, delay)
WHERE j.id = d.id
  AND CASE WHEN :taken THEN j.status IN ('pending', 'retrying')
           ELSE j.status = 'processing' AND j.worker_id = :worker_id END
RETURNING j.id;

-- cancel_statement --
-- Stop the statement a lane's backend is running (a handler being stopped:
-- its timeout, a cancel), from another connection; the backend carries on.
SELECT pg_cancel_backend(:pid);

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
-- They wait where they were, behind the floors of lanes that took the jobs
-- after them; the update trigger says where, and wakes the workers.
SELECT count(*) AS n FROM back;

-- record_batch --
-- Before a quick batch runs: its jobs and its transaction, on a connection
-- of their own (committed at once). The jobs show nothing of the batch until
-- it commits; if the worker dies first, this row is what names them
-- (`rescue`). One row per lane at a time: the lane's row of its previous
-- batch (:previous, its ctid as this statement returned it; NULL: none) is
-- deleted by its address, and the new one inserted. Never an update of one
-- row looked up by its key: while vacuum is held back, every overwrite would
-- leave one more version of that row for the next lookup to walk past.
-- The table is UNLOGGED, so this costs no WAL flush.
WITH previous AS (
    DELETE FROM jobqueue_batches
    WHERE ctid = CAST(:previous AS tid) AND worker_id = :worker_id AND lane = :lane
)
INSERT INTO jobqueue_batches (worker_id, lane, xid, job_ids)
VALUES (:worker_id, :lane, :xid, CAST(:ids AS uuid[]))
RETURNING ctid;

-- reap --
-- End the connections left behind by workers that are gone (no liveness
-- lock: crashed, or fenced), waiting up to a second for each: a lane of a
-- crashed worker may still be inside a long statement, its batch's locks
-- held, and `rescue` must know how its batch ended. The worker id is read
-- from the application name; a worker takes its liveness lock before it
-- names any connection after its id.
WITH live AS MATERIALIZED (
    SELECT CAST(objid AS bigint) AS worker_id
    FROM pg_locks
    WHERE locktype = 'advisory' AND granted AND objsubid = 2
      AND classid = CAST(:worker_lock_class AS oid)
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
), left_behind AS MATERIALIZED (
    SELECT pid FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid()
      AND application_name ~ '^jobqueue worker [0-9]+ '
      AND CAST(substring(application_name FROM '^jobqueue worker ([0-9]+) ') AS bigint)
          NOT IN (SELECT worker_id FROM live)
)
SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 1000)) AS terminated
FROM left_behind;

-- rescue --
-- Return to the queue the jobs of workers that are gone, and find out which
-- job took its worker down. A live worker holds an advisory lock (class
-- :worker_lock_class, key = its id) on its own connection for as long as it
-- lives; PostgreSQL drops it the moment the connection dies, so a missing
-- lock means a dead worker (crashed, or fenced as hung).
--
-- What a dead worker held: its claimed jobs (`processing` under its id) and
-- the jobs of its quick batches that never committed (`jobqueue_batches`,
-- whose transactions aborted). A worker that held one job only died running
-- it: that attempt counts, retried after its backoff (:base, :factor, :cap)
-- or failed for good, with the worker named in error_message and
-- error_history. A worker that held several gives no culprit, and none of
-- them is blamed: they go back uncounted. Either way they are marked
-- `run_alone`, so that each runs next with nothing beside it and a death
-- then names it. A dead worker with a batch still `in progress` (a lane
-- `reap` could not end yet) is left for the next tick, whole.
--
-- The ledger is read only for workers that are gone. Each lane inserts a row
-- per batch and deletes its previous one, so while vacuum is held back the
-- ledger holds a dead version for every batch since; a pass over it, every
-- tick, grew with them. `ledger` finds the workers that have rows instead,
-- one probe each: a backward scan of the primary key (worker_id, lane, xid)
-- meets a worker's newest row first, which is live (xids only grow), and
-- the next probe jumps below that worker's id. The rows of the gone are then
-- read by key (`= ANY(ARRAY(…))`: an index scan of those ids, whatever the
-- statistics say of a table that is mostly dead versions).
WITH RECURSIVE live AS MATERIALIZED (
    SELECT CAST(objid AS bigint) AS worker_id
    FROM pg_locks
    WHERE locktype = 'advisory' AND granted AND objsubid = 2
      AND classid = CAST(:worker_lock_class AS oid)
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
), ledger AS (
    (SELECT worker_id FROM jobqueue_batches ORDER BY worker_id DESC, lane DESC, xid DESC LIMIT 1)
    UNION ALL
    SELECT (SELECT b.worker_id FROM jobqueue_batches AS b
            WHERE b.worker_id < l.worker_id
            ORDER BY b.worker_id DESC, b.lane DESC, b.xid DESC LIMIT 1)
    FROM ledger AS l
    WHERE l.worker_id IS NOT NULL
), batches AS MATERIALIZED (
    SELECT b.worker_id, pg_xact_status(CAST(CAST(b.xid AS text) AS xid8)) AS ended
    FROM jobqueue_batches AS b
    WHERE b.worker_id = ANY(ARRAY(SELECT worker_id FROM ledger
                                  WHERE worker_id NOT IN (SELECT worker_id FROM live)))
), unsettled AS MATERIALIZED (
    SELECT DISTINCT worker_id FROM batches WHERE ended = 'in progress'
), gone AS (
    -- Deleting the ledger rows decides who handles them: a rescue running at
    -- the same moment finds them deleted and leaves their jobs alone.
    DELETE FROM jobqueue_batches AS b
    WHERE b.worker_id = ANY(ARRAY(SELECT worker_id FROM batches
                                  WHERE worker_id NOT IN (SELECT worker_id FROM unsettled)))
    RETURNING b.worker_id, b.job_ids,
              pg_xact_status(CAST(CAST(b.xid AS text) AS xid8)) AS ended
), held AS MATERIALIZED (
    SELECT j.worker_id AS dead, j.id, true AS claimed
    FROM jobs AS j
    WHERE j.status = 'processing' AND j.worker_id NOT IN (SELECT worker_id FROM live)
      AND j.worker_id NOT IN (SELECT worker_id FROM unsettled)
    UNION ALL
    SELECT g.worker_id, t.id, false
    FROM gone AS g, unnest(g.job_ids) AS t(id)
    WHERE g.ended = 'aborted'
), settled AS MATERIALIZED (
    SELECT dead, count(DISTINCT id) AS n FROM held GROUP BY dead
), back AS (
    UPDATE jobs AS j
    SET status = CASE WHEN s.n > 1 THEN CASE WHEN j.retry_count > 0 THEN 'retrying'
                                             ELSE 'pending' END
                      WHEN j.retry_count < j.max_retries THEN 'retrying'
                      ELSE 'failed' END,
        retry_count = j.retry_count
                      + CASE WHEN s.n = 1 AND j.retry_count < j.max_retries THEN 1 ELSE 0 END,
        run_at = CASE WHEN s.n = 1 AND j.retry_count < j.max_retries
                      THEN statement_timestamp() + make_interval(secs => least(
                               :cap, :base * power(:factor, least(j.retry_count, 64))))
                      ELSE j.run_at END,
        next_retry_at = CASE WHEN s.n = 1 AND j.retry_count < j.max_retries
                             THEN statement_timestamp() + make_interval(secs => least(
                                      :cap, :base * power(:factor, least(j.retry_count, 64))))
                             ELSE j.next_retry_at END,
        completed_at = CASE WHEN s.n = 1 AND j.retry_count >= j.max_retries
                            THEN statement_timestamp() END,
        started_at = CASE WHEN s.n = 1 THEN j.started_at END,
        worker_id = CASE WHEN s.n = 1 THEN h.dead END,
        error_message = CASE WHEN s.n = 1
                             THEN format('its worker (id %s) died while running it', h.dead)
                             ELSE j.error_message END,
        error_history = CASE WHEN s.n = 1 THEN j.error_history || jsonb_build_array(
                                 jsonb_build_object(
                                     'attempt', j.retry_count + 1,
                                     'error', format('its worker (id %s) died while running it',
                                                     h.dead),
                                     'at', statement_timestamp(), 'worker_id', h.dead))
                             ELSE j.error_history END,
        run_alone = true
    FROM held AS h JOIN settled AS s ON s.dead = h.dead
    WHERE j.id = h.id
      -- Checked again on the row as it is once locked: a rescue that waited
      -- for another's finds its jobs no longer as it saw them.
      AND (h.claimed AND j.status = 'processing' AND j.worker_id = h.dead
           OR NOT h.claimed AND j.status IN ('pending', 'retrying'))
    RETURNING j.id, s.n = 1 AS counted, j.status
)
SELECT n, counted, failed,
       CASE WHEN n > 0 THEN pg_notify('jobqueue', 'alone') END AS notified,
       -- The callers of `jobqueue.wait()` of a job failed for good hear of it.
       CASE WHEN failed > 0
            THEN (SELECT count(pg_notify('jobqueue_done', CAST(b.id AS text)))
                  FROM back AS b
                  WHERE b.status = 'failed'
                    AND EXISTS (SELECT FROM jobqueue_waiters AS w WHERE w.job_id = b.id))
       END AS told
FROM (SELECT count(*) AS n, count(*) FILTER (WHERE counted) AS counted,
             count(*) FILTER (WHERE status = 'failed') AS failed
      FROM back) AS c;

-- claim_alone --
-- One due job of queue :queue that must run alone (`run_alone`), for a
-- worker with nothing else running: if the worker dies now, this job is why.
-- After `lock_queue` in the same transaction, and within the queue's
-- settings as `claim_limited` counts them (nothing while paused; a queue
-- without settings has room). Reads idx_jobs_alone, which holds only these.
WITH q AS (
    SELECT paused, concurrency, rate_limit,
           to_timestamp(floor(extract(epoch FROM statement_timestamp()) / rate_period)
                        * rate_period) AS window_now,
           window_start, window_count
    FROM jobqueue_queues
    WHERE name = :queue
), room AS (
    SELECT coalesce((SELECT CASE WHEN q.paused THEN 0 ELSE greatest(0, least(
                1,
                coalesce(q.concurrency - (SELECT count(*) FROM jobs
                                          WHERE status = 'processing' AND queue = :queue), 1),
                coalesce(q.rate_limit - CASE WHEN q.window_start = q.window_now
                                             THEN q.window_count ELSE 0 END, 1))) END
                     FROM q), 1) AS n
), due AS (
    SELECT id
    FROM jobs
    WHERE queue = :queue AND run_alone AND status IN ('pending', 'retrying')
      AND run_at <= now() AND job_type = ANY(CAST(:job_types AS text[]))
    ORDER BY priority DESC, run_at
    LIMIT (SELECT n FROM room)
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE jobs AS j
    SET status = 'processing', started_at = statement_timestamp(), worker_id = :worker_id
    FROM due
    WHERE j.id = due.id
    RETURNING j.id, j.job_type, CAST(j.payload AS text) AS payload, j.retry_count,
              j.max_retries, j.timeout, j.priority,
              CAST(extract(epoch FROM j.run_at) * 1000000 AS bigint) AS due_us,
              CAST(NULL AS timestamptz) AS floor, CAST(NULL AS uuid) AS floor_id,
              CAST(NULL AS tid) AS tid
), counted AS (
    UPDATE jobqueue_queues AS s
    SET window_start = q.window_now,
        window_count = CASE WHEN s.window_start = q.window_now THEN s.window_count ELSE 0 END
                       + (SELECT count(*) FROM claimed)
    FROM q
    WHERE s.name = :queue AND s.rate_limit IS NOT NULL
      AND EXISTS (SELECT 1 FROM claimed)
)
SELECT * FROM claimed;

-- alone_waiting --
-- The queues with jobs that must run alone, among the types and :queues
-- (NULL: all) a worker takes, and when their earliest is due (seconds;
-- negative: overdue). Few rows or none: idx_jobs_alone holds only these.
SELECT queue, CAST(extract(epoch FROM min(run_at) - now()) AS float8) AS due_in
FROM jobs
WHERE run_alone AND status IN ('pending', 'retrying')
  AND job_type = ANY(CAST(:job_types AS text[]))
  AND (CAST(:queues AS text[]) IS NULL OR queue = ANY(CAST(:queues AS text[])))
GROUP BY queue
ORDER BY queue;

-- register_worker --
-- A worker introduces itself; its heartbeat starts now.
-- It says what it takes (queues, NULL: all; job types), for `jobqueue status`.
INSERT INTO jobqueue_workers (id, name, mode, state, queues, job_types)
VALUES (:id, :name, :mode, 'standby', CAST(:queues AS text[]), CAST(:job_types AS text[]))
ON CONFLICT (id) DO UPDATE
SET name = EXCLUDED.name, mode = EXCLUDED.mode, state = 'standby',
    queues = EXCLUDED.queues, job_types = EXCLUDED.job_types,
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
-- A worker that stops cleanly says goodbye; its batches' ledger goes with it
-- (whatever it abandoned on the way out was its own doing, not a job's).
WITH batches AS (
    DELETE FROM jobqueue_batches WHERE worker_id = :id
)
DELETE FROM jobqueue_workers WHERE id = :id;

-- rename_connection --
-- Say what this connection is now (a worker's role changed; its id is taken).
SELECT set_config('application_name', :name, false);

-- try_lock --
-- Take a session lock if nobody holds it: the active worker's lock, or the
-- maintenance leader's.
SELECT pg_try_advisory_lock(:lock_class, :key) AS locked;

-- archive_days --
-- The slice the next `archive` moves: the oldest :limit jobs finished
-- :after seconds ago (from :since on, as `archive`), and where it ends
-- (`upto`: `archive` moves nothing after it, so a row it takes in place of
-- one it skips is never from a day that was not looked at); and the first
-- and last day (UTC) of those it keeps, those not past retention, whose
-- partitions the leader adds first (`jobqueue_history_add`, every day
-- between the two).
SELECT max(completed_at) AS upto,
       CAST(min(completed_at) FILTER (WHERE kept) AT TIME ZONE 'UTC' AS date) AS first_day,
       CAST(max(completed_at) FILTER (WHERE kept) AT TIME ZONE 'UTC' AS date) AS last_day
FROM (SELECT completed_at,
             completed_at >= now() - make_interval(secs => CASE WHEN status = 'completed'
                                                       THEN CAST(:keep_completed AS float8)
                                                       ELSE CAST(:keep_failed AS float8) END)
                 AS kept
      FROM jobs
      WHERE completed_at >= CAST(:since AS timestamptz)
        AND completed_at < now() - make_interval(secs => :after)
        AND status IN ('completed', 'failed')
      ORDER BY completed_at
      LIMIT :limit) AS slice;

-- history_add --
-- The history's partitions for every day from :first_day to :last_day, if
-- missing (0012): one round trip, however many days a slice spans.
SELECT jobqueue_history_add(CAST(d AS date))
FROM generate_series(CAST(:first_day AS date), CAST(:last_day AS date),
                     interval '1 day') AS d;

-- archive --
-- Move up to :limit jobs that finished more than :after seconds ago, and
-- no later than :upto (`archive_days`), from `jobs` to the history, oldest
-- first, in one transaction: each job is in
-- one table or the other, never both, never neither, in any snapshot.
-- Those already past their retention (:keep_completed, :keep_failed
-- seconds) are deleted instead. The history's counts (by day, status,
-- queue and type) grow by what it received. SKIP LOCKED: a failed job
-- being retried by hand stays where it is. From :since on ('-infinity': from
-- the front): the leader starts each slice where the last one ended (the
-- row says where: `reached`), so that while a long transaction pins the
-- vacuum horizon it does not step over the index entries of every job it
-- has moved since, which vacuum cannot remove meanwhile (300,000 of them
-- cost an idle tick 40 ms); a look from the front once a minute finds a
-- job whose completion committed after a later one's slice moved on. On
-- the way, forget the waiters
-- of `jobqueue.wait()` that died without deleting their row: their
-- connection is gone (no backend with their pid, or a newer one that
-- reuses it) or their job has left `jobs`. A data-modifying CTE always
-- runs, referenced or not.
WITH gone_waiters AS (
    DELETE FROM jobqueue_waiters AS w
    WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE jobs.id = w.job_id)
       OR NOT EXISTS (SELECT 1 FROM pg_stat_activity AS a
                      WHERE a.pid = w.pid
                        AND (a.backend_start IS NULL OR a.backend_start <= w.since))
), moved AS (
    DELETE FROM jobs
    WHERE id IN (SELECT id FROM jobs
                 WHERE completed_at >= CAST(:since AS timestamptz)
                   AND completed_at <= CAST(:upto AS timestamptz)
                   AND completed_at < now() - make_interval(secs => :after)
                   AND status IN ('completed', 'failed')
                 ORDER BY completed_at
                 LIMIT :limit
                 FOR UPDATE SKIP LOCKED)
    RETURNING *
), kept AS (
    INSERT INTO jobqueue_history
    SELECT * FROM moved
    WHERE completed_at >= now() - make_interval(secs => CASE WHEN status = 'completed'
                                                             THEN CAST(:keep_completed AS float8)
                                                             ELSE CAST(:keep_failed AS float8) END)
    RETURNING status, completed_at, queue, job_type
), counted AS (
    INSERT INTO jobqueue_history_counts AS c (status, day, queue, job_type, n)
    SELECT status, CAST(completed_at AT TIME ZONE 'UTC' AS date), queue, job_type, count(*)
    FROM kept
    GROUP BY 1, 2, 3, 4
    ON CONFLICT (status, day, queue, job_type) DO UPDATE SET n = c.n + excluded.n
)
SELECT count(*) AS moved, max(completed_at) AS reached FROM moved;

-- history_expired --
-- The history's partitions whose whole day (UTC) is past its status's
-- retention (:keep_completed, :keep_failed seconds), oldest first: each
-- goes with `history_drop`. The day is in the partition's name (0012).
SELECT s.status, to_date(right(c.relname, 8), 'YYYYMMDD') AS day
FROM (VALUES ('completed', CAST(:keep_completed AS float8)),
             ('failed', CAST(:keep_failed AS float8))) AS s(status, keep)
JOIN pg_inherits AS i ON i.inhparent = to_regclass('jobqueue_history_' || s.status)
JOIN pg_class AS c ON c.oid = i.inhrelid
WHERE c.relname ~ '_[0-9]{8}$'
  AND CAST(to_date(right(c.relname, 8), 'YYYYMMDD') + 1 AS timestamp) AT TIME ZONE 'UTC'
      <= now() - make_interval(secs => s.keep)
ORDER BY day, s.status;

-- history_drop --
-- One partition of the history dropped, with its counts (0012): a brief
-- lock on its parent, given up after 200 ms rather than queueing readers.
SELECT jobqueue_history_drop(:status, CAST(:day AS date)) AS dropped;

-- history_counts --
-- The jobs the history holds, by status, queue and type: kept by the
-- statements that move jobs in and out, so exact, and a few rows to read
-- whatever the history holds. Read beside `estimate_finished`, when the
-- jobs in `jobs` are estimated (`count_finished` counts both at once).
SELECT status, queue, job_type, CAST(sum(n) AS bigint) AS n
FROM jobqueue_history_counts
GROUP BY status, queue, job_type
HAVING sum(n) > 0;

-- next_due --
-- Seconds until the earliest waiting job this worker could run is due
-- (negative: overdue; NULL: none), in :queues (NULL: every queue) and not
-- paused. Exact, so
-- a pass over the waiting jobs: only a burst worker asks, once idle, to know
-- whether it is done.
SELECT extract(epoch FROM min(run_at) - now()) AS seconds
FROM jobs
WHERE status IN ('pending', 'retrying') AND job_type = ANY(CAST(:job_types AS text[]))
  AND (CAST(:queues AS text[]) IS NULL OR queue = ANY(CAST(:queues AS text[])))
  AND NOT EXISTS (SELECT 1 FROM jobqueue_queues AS q WHERE q.name = jobs.queue AND q.paused);

-- schema_revision --
-- The revision `jobqueue migrate` brought the schema to (alembic's table).
SELECT version_num FROM jobqueue_alembic_version;

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
FROM jobqueue_all_jobs
WHERE completed_at >= now() - make_interval(secs => :window);

-- workers --
-- Workers that announced themselves, with their heartbeat's age and what
-- they take (queues, NULL: every queue; the job types they have handlers for).
SELECT id, name, mode, state, started_at, queues, job_types,
       extract(epoch FROM now() - heartbeat_at) AS heartbeat_age
FROM jobqueue_workers
ORDER BY started_at;

-- get_job --
-- One job, everything about it, wherever it is: in `jobs`, or in the
-- history's partitions from the day its id was made on (`jobqueue_id_floor`;
-- an id of another kind: all of them). Every lookup by id below does the
-- same.
SELECT id, job_type, queue, priority, unique_key, timeout, payload, status, retry_count,
       max_retries, next_retry_at, run_at,
       error_message, error_history, result, created_at, started_at, completed_at, worker_id
FROM jobqueue_all_jobs
WHERE id = :id AND (completed_at IS NULL OR completed_at >= jobqueue_id_floor(:id));

-- held --
-- The jobs that live quick batches hold. A quick batch locks its jobs and
-- runs them in one transaction without marking them (`take`), so the table
-- shows them waiting until it commits. Its ledger row (`record_batch`, one
-- write per batch, none per job) names them, and its transaction, still in
-- progress, says they are held now: `jobqueue status`, the dashboard,
-- /metrics and the API show these jobs running, with their worker and the
-- batch's start. A batch that ended shows nothing (committed: its jobs say
-- so themselves; rolled back: they are free again). :ids NULL: every held
-- job; else only those. Bounded by the lanes' batches, whatever the table.
SELECT j.id, j.job_type, j.queue, j.priority, j.timeout, j.status, j.retry_count,
       j.max_retries, j.run_at, j.next_retry_at, j.error_message, j.created_at,
       b.started_at, j.completed_at, jsonb_array_length(j.error_history) AS attempts,
       b.worker_id, b.started_at AS at
FROM jobqueue_batches AS b
CROSS JOIN LATERAL unnest(b.job_ids) AS h(id)
JOIN jobs AS j ON j.id = h.id
WHERE pg_xact_status(CAST(CAST(b.xid AS text) AS xid8)) = 'in progress'
  AND j.status IN ('pending', 'retrying')
  AND (CAST(:ids AS uuid[]) IS NULL OR h.id = ANY(CAST(:ids AS uuid[])));

-- ---- HTTP API and observability ----

-- api_list_jobs --
-- A page of jobs, newest first, optionally of one status, type and queue,
-- from `jobs` and the history together (a merge of their id indexes).
-- Newest first is the id order backwards: ids sort in the order jobs were
-- made (`jobqueue_id`), so no index more for the hot path to keep up, and no
-- sort of the table. Keyset pagination: :before_id is where the previous page
-- ended (NULL for the first), so a deep page costs what the first one does
-- and jobs added meanwhile never shift a page (each job shows up once). A page
-- looks at :scan jobs at most, whatever the filters match: it can hold fewer
-- than :limit, even none, and `api_list_scanned` then says where the next
-- one goes on. (COALESCE, not `IS NULL OR`: a generic plan keeps it an index
-- condition.)
SELECT id, job_type, queue, priority, timeout, status, retry_count, max_retries, run_at,
       next_retry_at, error_message, created_at, started_at, completed_at,
       jsonb_array_length(error_history)
           + CASE WHEN status IN ('processing', 'completed') THEN 1 ELSE 0 END AS attempts,
       worker_id
FROM (SELECT id, job_type, queue, priority, timeout, status, retry_count, max_retries, run_at,
             next_retry_at, error_message, created_at, started_at, completed_at,
             error_history, worker_id
      FROM jobqueue_all_jobs
      WHERE id < COALESCE(CAST(:before_id AS uuid), 'ffffffff-ffff-ffff-ffff-ffffffffffff')
      ORDER BY id DESC
      LIMIT :scan) AS j
WHERE (CAST(:status AS text) IS NULL OR status = CAST(:status AS text))
  AND (CAST(:job_type AS text) IS NULL OR job_type = CAST(:job_type AS text))
  AND (CAST(:queue AS text) IS NULL OR queue = CAST(:queue AS text))
ORDER BY id DESC
LIMIT :limit;

-- api_list_scanned --
-- The last job a page of `api_list_jobs` looked at, when it looked at all
-- :scan it may (no row: it reached the oldest job). The next page goes on
-- after it.
SELECT id FROM jobqueue_all_jobs
WHERE id < COALESCE(CAST(:before_id AS uuid), 'ffffffff-ffff-ffff-ffff-ffffffffffff')
ORDER BY id DESC
OFFSET :scan - 1
LIMIT 1;

-- job_status --
-- One job's status; no row: no such job.
SELECT status FROM jobqueue_all_jobs
WHERE id = :id AND (completed_at IS NULL OR completed_at >= jobqueue_id_floor(:id));

-- active_holder --
-- The connection that holds this database's active-worker lock, named as
-- workers name it (`jobqueue worker ID active`); no row: nobody holds it.
SELECT a.application_name
FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
  AND l.classid = CAST(:lock_class AS oid) AND l.objid = CAST(:key AS oid)
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database());

-- jobs_by_prefix --
-- The jobs whose id begins with a prefix a person typed (:low and :high: the
-- prefix filled out with 0s and with fs), one range of the primary key: at
-- most two, enough to tell one job from several.
SELECT id FROM jobqueue_all_jobs
WHERE id BETWEEN CAST(:low AS uuid) AND CAST(:high AS uuid)
ORDER BY id
LIMIT 2;

-- api_retry_job --
-- Run a failed job again: pending, due now, its retries renewed, its error
-- history kept. Only a `failed` job qualifies (no row back otherwise). One
-- still in `jobs` is updated; one in the history moves back to `jobs`
-- (and out of the history's counts). The update trigger, or the insert
-- one, wakes idle workers at commit. No row can also mean the leader moved
-- the job to the history after this statement's snapshot was taken: the
-- caller asks once more.
WITH retried AS (
    UPDATE jobs
    SET status = 'pending', retry_count = 0, run_at = now(), next_retry_at = NULL,
        started_at = NULL, completed_at = NULL, worker_id = NULL
    WHERE id = :id AND status = 'failed'
    RETURNING id
), back AS (
    DELETE FROM jobqueue_history
    WHERE id = :id AND status = 'failed' AND completed_at >= jobqueue_id_floor(:id)
      AND NOT EXISTS (SELECT FROM retried)
    RETURNING *
), uncounted AS (
    UPDATE jobqueue_history_counts AS c
    SET n = c.n - 1
    FROM back AS b
    WHERE c.status = 'failed' AND c.day = CAST(b.completed_at AT TIME ZONE 'UTC' AS date)
      AND c.queue = b.queue AND c.job_type = b.job_type
), restored AS (
    INSERT INTO jobs (id, job_type, payload, status, retry_count, max_retries, run_at,
                      error_message, error_history, result, created_at, queue, priority,
                      unique_key, timeout, run_alone, trace_context)
    SELECT id, job_type, payload, 'pending', 0, max_retries, now(), error_message,
           error_history, result, created_at, queue, priority, unique_key, timeout,
           run_alone, trace_context
    FROM back
    RETURNING id
)
SELECT id FROM retried
UNION ALL
SELECT id FROM restored;

-- count_unfinished --
-- The unfinished jobs by queue and type, counted exactly from the indexes
-- that hold only them, never from the table's history of finished jobs:
-- the waiting ones (pending and retrying together) from idx_jobs_pickable,
-- read index-only; the retrying ones from idx_jobs_retrying; the running
-- ones from idx_jobs_processing. Pending is waiting minus retrying, worked
-- out in `routing.py` (one statement, one snapshot: never fewer waiting
-- than retrying). For the waiting: how many are due, and the seconds since
-- the earliest run_at (when any is due, how long the longest-waiting one
-- has been due). Its cost grows with the jobs that wait, not with those
-- that finished: about 75 ms per million waiting jobs on the machine of
-- BENCHMARKS.md. `jobqueue status`, `jobqueue queue list`, `/queues`,
-- `/metrics` and the dashboard all read it; which due jobs no live worker
-- takes is worked out from it and the workers' rows, in Python.
SELECT 'waiting' AS status, queue, job_type, count(*) AS n,
       count(*) FILTER (WHERE run_at <= now()) AS due,
       CAST(extract(epoch FROM now() - min(run_at)) AS float8) AS oldest_age
FROM jobs
WHERE status IN ('pending', 'retrying')
GROUP BY queue, job_type
UNION ALL
SELECT 'retrying', queue, job_type, count(*), count(*) FILTER (WHERE run_at <= now()),
       CAST(extract(epoch FROM now() - min(run_at)) AS float8)
FROM jobs
WHERE status = 'retrying'
GROUP BY queue, job_type
UNION ALL
SELECT 'processing', queue, job_type, count(*), 0, NULL
FROM jobs
WHERE status = 'processing'
GROUP BY queue, job_type;

-- count_finished_upto --
-- How many jobs have finished, counted no further than :cap: whether
-- counting them by queue and type (`count_finished`) is cheap. Reads at most
-- :cap entries of idx_jobs_finished (a finished job is one with a
-- completed_at: completed, or failed for good).
SELECT count(*) AS n
FROM (SELECT FROM jobs WHERE completed_at IS NOT NULL LIMIT :cap) AS f;

-- count_finished --
-- The finished jobs by status, queue and type, counted: those in `jobs`, a
-- pass over all of them, made only while there are few
-- (`count_finished_upto`), and the history's from its counts, in one
-- snapshot, so a slice the leader moves meanwhile counts once.
SELECT status, queue, job_type, CAST(sum(n) AS bigint) AS n
FROM (SELECT status, queue, job_type, count(*) AS n
      FROM jobs
      WHERE completed_at IS NOT NULL AND status IN ('completed', 'failed')
      GROUP BY status, queue, job_type
      UNION ALL
      SELECT status, queue, job_type, n FROM jobqueue_history_counts) AS f
GROUP BY status, queue, job_type
HAVING sum(n) > 0;

-- estimate_finished --
-- The finished jobs by status, queue and type, estimated from PostgreSQL's
-- statistics when there are too many to count: the table's rows as the
-- planner reckons them (rows per page at the last ANALYZE or VACUUM, times
-- the pages the table has now) times each combination's share of ANALYZE's
-- sample, from the extended statistics `jobqueue_jobs_kinds` (0011: the
-- most common combinations of status, queue and type). The combinations of
-- a status are scaled to add up to that status's own share (pg_stats), so a
-- combination too rare to be listed is spread over its status's listed
-- ones; a status none of whose combinations is listed gets one row without
-- queue and type. As fresh as the last ANALYZE (autovacuum's, once a tenth
-- of the table has changed), and within a few per cent of the truth where
-- ANALYZE's sample of 30,000 rows holds a few hundred of a combination. No
-- row at all: no statistics to go by (the table was never analyzed, or
-- this role does not own it and may not see them), and the caller counts.
WITH rel AS (
    SELECT n.nspname,
           c.reltuples / c.relpages
               * (pg_relation_size(c.oid) / CAST(current_setting('block_size') AS int)) AS rows
    FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
    WHERE c.oid = to_regclass('jobs') AND c.reltuples > 0 AND c.relpages > 0
), items AS (
    SELECT s.most_common_vals[i][array_position(s.attnames, 'status')] AS status,
           s.most_common_vals[i][array_position(s.attnames, 'queue')] AS queue,
           s.most_common_vals[i][array_position(s.attnames, 'job_type')] AS job_type,
           s.most_common_freqs[i] AS freq
    FROM rel
    JOIN pg_stats_ext AS s ON s.schemaname = rel.nspname AND s.tablename = 'jobs'
                          AND s.statistics_name = 'jobqueue_jobs_kinds'
    CROSS JOIN LATERAL generate_subscripts(s.most_common_freqs, 1) AS i
), shares AS (
    SELECT v.status, v.freq
    FROM rel
    JOIN pg_stats AS p ON p.schemaname = rel.nspname AND p.tablename = 'jobs'
                      AND p.attname = 'status'
    CROSS JOIN LATERAL unnest(CAST(CAST(p.most_common_vals AS text) AS text[]),
                              p.most_common_freqs) AS v(status, freq)
    WHERE v.status IN ('completed', 'failed')
), listed AS (
    SELECT status, sum(freq) AS freq FROM items GROUP BY status
)
SELECT i.status, i.queue, i.job_type,
       CAST(round(r.rows * i.freq * COALESCE(s.freq / l.freq, 1)) AS bigint) AS n
FROM items AS i
CROSS JOIN rel AS r
JOIN listed AS l ON l.status = i.status
LEFT JOIN shares AS s ON s.status = i.status
WHERE i.status IN ('completed', 'failed')
UNION ALL
SELECT s.status, NULL, NULL, CAST(round(r.rows * s.freq) AS bigint)
FROM shares AS s
CROSS JOIN rel AS r
WHERE EXISTS (SELECT FROM items)
  AND NOT EXISTS (SELECT FROM listed AS l WHERE l.status = s.status);

-- queue_health --
-- The jobs table's upkeep as PostgreSQL's statistics see it. (How long the
-- oldest due job has waited comes from `count_unfinished`.)
SELECT s.n_live_tup AS live_tuples, s.n_dead_tup AS dead_tuples,
       extract(epoch FROM s.last_autovacuum) AS last_autovacuum
FROM (SELECT to_regclass('jobs') AS relid) AS t
LEFT JOIN pg_stat_user_tables AS s ON s.relid = t.relid;

-- metrics_finished --
-- Jobs that finished (completed, or failed for good) in the last :window
-- seconds, grouped by type, status and histogram bucket of their wait (from
-- due to the start of their last attempt) and run time. A bucket is given as
-- how many of the histogram's bounds are at or above the value: :neg_bounds
-- holds the bounds negated, smallest first, so width_bucket counts them.
-- Cancelled jobs never started and are left out.
WITH finished AS (
    SELECT job_type, status,
           greatest(CAST(extract(epoch FROM started_at - greatest(created_at, run_at))
                         AS float8), 0) AS wait,
           greatest(CAST(extract(epoch FROM completed_at - started_at) AS float8), 0) AS run
    FROM jobqueue_all_jobs
    WHERE completed_at >= now() - make_interval(secs => :window) AND started_at IS NOT NULL
)
SELECT job_type, status,
       width_bucket(-wait, CAST(:neg_bounds AS float8[])) AS wait_above,
       width_bucket(-run, CAST(:neg_bounds AS float8[])) AS run_above,
       count(*) AS n, sum(wait) AS wait_sum, sum(run) AS run_sum
FROM finished
GROUP BY 1, 2, 3, 4;

-- metrics_failed_attempts --
-- Failed attempts recorded in the last :window seconds, by type, and how many
-- of them were scheduled again: all but the attempt that failed a job for
-- good, which `fail` records at the very instant it sets completed_at. Read
-- from the jobs that can hold one, each through its index: retrying
-- (idx_jobs_retrying), running (idx_jobs_processing: a retry under way),
-- finished in the window (idx_jobs_finished); never a pass over the table.
-- Left out: a failed job put back by hand (`POST /jobs/{id}/retry`, the
-- dashboard: pending again) within the window, until it runs again.
SELECT j.job_type, count(*) AS failed_attempts,
       count(*) FILTER (
           WHERE j.completed_at IS DISTINCT FROM CAST(e ->> 'at' AS timestamptz)) AS retries
FROM (SELECT job_type, completed_at, error_history FROM jobs WHERE status = 'retrying'
      UNION ALL
      SELECT job_type, completed_at, error_history FROM jobs WHERE status = 'processing'
      UNION ALL
      SELECT job_type, completed_at, error_history FROM jobqueue_all_jobs
      WHERE completed_at >= now() - make_interval(secs => :window)) AS j,
     jsonb_array_elements(j.error_history) AS e
WHERE CAST(e ->> 'at' AS timestamptz) >= now() - make_interval(secs => :window)
GROUP BY j.job_type;

-- horizon --
-- What holds back the xmin horizon of this database, oldest first: while it
-- lasts, vacuum can remove no row version that died after it began, so the
-- jobs table and its indexes keep every finished job's dead versions and
-- each claim steps over them. Holders: a transaction or snapshot of a
-- session in this database (since PostgreSQL 14 other databases' sessions
-- hold back only the shared catalogs), a walsender or replication slot with
-- an xmin (a standby's hot_standby_feedback), a prepared transaction. This
-- statement's own snapshot is left out. Sessions of other roles show only
-- to a superuser or a member of pg_read_all_stats.
WITH holders AS (
    SELECT CASE WHEN backend_type = 'walsender' THEN 'standby feedback'
                ELSE 'transaction' END AS kind,
           pid, application_name AS name, state,
           CAST(extract(epoch FROM now() - coalesce(xact_start, backend_start)) AS float8)
               AS age_seconds,
           greatest(age(backend_xmin), age(backend_xid)) AS xid_age
    FROM pg_stat_activity
    WHERE pid <> pg_backend_pid()
      AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
      AND (datname = current_database() OR backend_type = 'walsender')
    UNION ALL
    SELECT 'prepared transaction', NULL, gid, 'prepared',
           CAST(extract(epoch FROM now() - prepared) AS float8), age(transaction)
    FROM pg_prepared_xacts
    WHERE database = current_database()
    UNION ALL
    SELECT 'replication slot', active_pid, slot_name,
           CASE WHEN active THEN 'active' ELSE 'inactive' END, NULL, age(xmin)
    FROM pg_replication_slots
    WHERE xmin IS NOT NULL
)
SELECT kind, pid, name, state, age_seconds, xid_age
FROM holders
ORDER BY xid_age DESC, age_seconds DESC NULLS LAST
LIMIT 1;

-- recent_errors --
-- The most frequent errors of failed attempts in the last :window seconds,
-- from the jobs `metrics_failed_attempts` reads, and on every row how many
-- failed attempts there were in all (`jobqueue status` needs both: one
-- read of those jobs, not two).
SELECT j.job_type, e ->> 'error' AS error, count(*) AS n,
       max(CAST(e ->> 'at' AS timestamptz)) AS last_at,
       CAST(sum(count(*)) OVER () AS bigint) AS failed_attempts
FROM (SELECT job_type, error_history FROM jobs WHERE status = 'retrying'
      UNION ALL
      SELECT job_type, error_history FROM jobs WHERE status = 'processing'
      UNION ALL
      SELECT job_type, error_history FROM jobqueue_all_jobs
      WHERE completed_at >= now() - make_interval(secs => :window)) AS j,
     jsonb_array_elements(j.error_history) AS e
WHERE CAST(e ->> 'at' AS timestamptz) >= now() - make_interval(secs => :window)
GROUP BY j.job_type, e ->> 'error'
ORDER BY n DESC, last_at DESC
LIMIT :limit;

-- api_get_job --
-- One job for the HTTP API, with its attempts (failed ones recorded, plus a
-- running or successful one). The JSON columns come as text and go into the
-- response as they are: no parsing, however large or deeply nested.
SELECT id, job_type, queue, priority, unique_key, timeout, status,
       jsonb_array_length(error_history)
           + CASE WHEN status IN ('processing', 'completed') THEN 1 ELSE 0 END AS attempts,
       retry_count, max_retries, run_at, next_retry_at, error_message,
       created_at, started_at, completed_at, worker_id,
       CAST(payload AS text) AS payload, CAST(error_history AS text) AS error_history,
       CAST(result AS text) AS result
FROM jobqueue_all_jobs
WHERE id = :id AND (completed_at IS NULL OR completed_at >= jobqueue_id_floor(:id));

-- ---- Queue settings (jobqueue.queues) ----

-- queue_set_paused --
-- Pause or resume a queue fleet-wide, and tell the workers (at commit).
WITH s AS (
    INSERT INTO jobqueue_queues AS q (name, paused)
    VALUES (:queue, :paused)
    ON CONFLICT (name) DO UPDATE SET paused = EXCLUDED.paused, updated_at = now()
    RETURNING q.name
)
SELECT pg_notify('jobqueue', 'queues') FROM s;

-- queue_set_limits --
-- Set a queue's limits (:set_concurrency / :set_rate false: keep that one as
-- it is; a NULL value: no limit), and tell the workers (at commit). A new
-- rate starts a new window count.
WITH s AS (
    INSERT INTO jobqueue_queues AS q (name, concurrency, rate_limit, rate_period)
    VALUES (:queue, CAST(:concurrency AS integer), CAST(:rate_limit AS integer),
            CAST(:rate_period AS float8))
    ON CONFLICT (name) DO UPDATE
    SET concurrency = CASE WHEN :set_concurrency THEN EXCLUDED.concurrency
                           ELSE q.concurrency END,
        rate_limit = CASE WHEN :set_rate THEN EXCLUDED.rate_limit ELSE q.rate_limit END,
        rate_period = CASE WHEN :set_rate THEN EXCLUDED.rate_period ELSE q.rate_period END,
        window_start = CASE WHEN :set_rate THEN NULL ELSE q.window_start END,
        window_count = CASE WHEN :set_rate THEN 0 ELSE q.window_count END,
        updated_at = now()
    RETURNING q.name
)
SELECT pg_notify('jobqueue', 'queues') FROM s;

-- queue_forget_plain --
-- A queue with no pause and no limits needs no row: without one, its claims
-- take the fast path.
DELETE FROM jobqueue_queues
WHERE name = :queue AND NOT paused AND concurrency IS NULL AND rate_limit IS NULL;

-- ---- Waiting for a job, cancelling one (jobqueue.control) ----

-- wait_register --
-- A caller of `jobqueue.wait()` says which job it waits for, on the
-- connection it listens on (pid: that backend, so `archive` can tell a caller
-- that died); `complete` and `fail` notify the jobs that have a row here.
INSERT INTO jobqueue_waiters (job_id) VALUES (:job_id)
ON CONFLICT DO NOTHING;

-- wait_check --
-- The job as it is now, for a waiter. FOR KEY SHARE: a job locked by a
-- quick batch (whose claims lock FOR UPDATE, the one mode this one waits
-- for) is read once that batch ends, never as it was before: had the
-- batch's `complete` missed this waiter's row, its outcome is seen here
-- instead. The weakest lock that does so, because `cancel` must be able to
-- tell it from a worker's (it locks FOR NO KEY UPDATE, which this mode lets
-- through; FOR SHARE would make it skip the job as a worker's). An update
-- under way outside a batch (a claimed job's `complete`, another cancel)
-- is not waited for: the job is read as it was, and a missed notification
-- costs the waiter its next reread. A job not in `jobs` is read from the
-- history (finished: nothing to wait for). No row: no such job, or one the
-- leader moved to the history after this statement's snapshot was taken
-- (the caller reads once more).
WITH live AS (
    SELECT id, job_type, queue, status, retry_count, error_message,
           CAST(result AS text) AS result, CAST(error_history AS text) AS error_history,
           created_at, started_at, completed_at
    FROM jobs
    WHERE id = :job_id
    FOR KEY SHARE
)
SELECT * FROM live
UNION ALL
SELECT id, job_type, queue, status, retry_count, error_message,
       CAST(result AS text), CAST(error_history AS text), created_at, started_at, completed_at
FROM jobqueue_history
WHERE id = :job_id AND completed_at >= jobqueue_id_floor(:job_id)
  AND NOT EXISTS (SELECT FROM live);

-- wait_forget --
-- A waiter leaves (its job finished, or it gave up).
DELETE FROM jobqueue_waiters WHERE job_id = :job_id AND pid = pg_backend_pid();

-- cancel --
-- Cancel a job. A waiting one (pending or retrying) that no worker holds
-- ends `failed` at once with :error_message ('cancelled…') and no entry in
-- error_history (no attempt was made); its waiters are told. One a worker
-- has (processing, or locked in a quick batch: SKIP LOCKED, so a cancel
-- never queues behind a batch) is asked to stop instead: 'cancel:<id>' on
-- the workers' channel, at commit. FOR NO KEY UPDATE, not FOR UPDATE: it
-- skips what claims lock (FOR UPDATE) but not a waiter's read (`wait_check`,
-- FOR KEY SHARE), which would otherwise leave the job pending, asked of
-- workers who do not have it. A finished job is left as it is. The row
-- says what the job was (this statement's snapshot) and whether it was
-- cancelled here; no row: no such job.
WITH cancelled AS (
    UPDATE jobs AS j
    SET status = 'failed', error_message = :error_message, completed_at = statement_timestamp(),
        next_retry_at = NULL, started_at = NULL
    WHERE j.id = (SELECT id FROM jobs WHERE id = :id AND status IN ('pending', 'retrying')
                  FOR NO KEY UPDATE SKIP LOCKED)
    RETURNING j.id
)
SELECT j.status AS was, c.id IS NOT NULL AS cancelled,
       CASE WHEN c.id IS NOT NULL
            THEN (SELECT count(pg_notify('jobqueue_done', CAST(w.job_id AS text)))
                  FROM jobqueue_waiters AS w WHERE w.job_id = c.id) END AS waiters_told,
       CASE WHEN c.id IS NULL AND j.status IN ('pending', 'retrying', 'processing')
            THEN pg_notify('jobqueue', 'cancel:' || CAST(j.id AS text)) END AS asked
FROM jobqueue_all_jobs AS j LEFT JOIN cancelled AS c ON c.id = j.id
WHERE j.id = :id AND (j.completed_at IS NULL OR j.completed_at >= jobqueue_id_floor(:id));

-- ---- Schedules ----

-- schedule_clock --
-- The database's time: every tick is computed from it, never from a worker's
-- clock, so workers on machines whose clocks disagree agree on the ticks.
SELECT now();

-- schedule_register --
-- The leader's schedules, once it leads: a new one starts at its latest tick
-- (:ticks, so nothing is enqueued before its next one); one already known
-- takes the expression it has now and keeps its last tick, so a tick missed
-- while no worker ran is enqueued once, by `schedule_fire`. Each row's last
-- tick comes back.
INSERT INTO jobqueue_schedules AS s (job_type, schedule, last_tick)
SELECT job_type, schedule, tick
FROM unnest(CAST(:job_types AS text[]), CAST(:schedules AS text[]),
            CAST(:ticks AS timestamptz[])) AS n(job_type, schedule, tick)
ON CONFLICT (job_type) DO UPDATE
SET schedule = EXCLUDED.schedule,
    updated_at = CASE WHEN s.schedule = EXCLUDED.schedule THEN s.updated_at ELSE now() END
RETURNING s.job_type, s.last_tick;

-- schedule_fire --
-- Enqueue the tick :ticks (ISO 8601 text) of each schedule whose last tick is
-- older, and advance its last tick, in one statement: the job and the
-- schedule's row commit together or not at all. Exactly once per tick: a
-- second leader firing the same tick at the same moment waits for the first
-- one's row lock, then finds last_tick no longer older and does nothing; the
-- unique key (schedule:<type>:<tick>) also refuses a second job for the tick
-- while the first is unfinished. The job's payload is {"tick": "<ISO>"}.
WITH due AS (
    SELECT job_type, tick, CAST(tick AS timestamptz) AS at, queue, priority
    FROM unnest(CAST(:job_types AS text[]), CAST(:ticks AS text[]),
                CAST(:queues AS text[]), CAST(:priorities AS integer[]))
         AS d(job_type, tick, queue, priority)
), advanced AS (
    UPDATE jobqueue_schedules AS s
    SET last_tick = due.at
    FROM due
    WHERE s.job_type = due.job_type AND s.last_tick < due.at
    RETURNING due.job_type, due.tick, due.queue, due.priority
)
INSERT INTO jobs (job_type, payload, queue, priority, unique_key)
SELECT job_type, jsonb_build_object('tick', tick), queue, priority,
       'schedule:' || job_type || ':' || tick
FROM advanced
ON CONFLICT (unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('pending', 'processing', 'retrying')
    DO NOTHING
RETURNING id, job_type, payload ->> 'tick' AS tick;

-- The dashboard (`jobqueue.ops.dashboard`). Each page reads through an
-- index and stops at its page: on a table of a million jobs a page view
-- costs what it costs on an empty one. The overview's counts come from
-- `count_unfinished` and the finished jobs' count or estimate, the reading
-- `/metrics` makes, shared by every viewer.

-- dashboard_series --
-- Jobs finished per :width-second bucket, from :back buckets before the
-- current one: how many completed, how many failed for good, and the p50
-- and p99 of due → completion of the completed ones. The dashboard reads its
-- whole window once, then only its last two buckets (the earlier ones are
-- final), so a viewer reads a few seconds of finished jobs per refresh,
-- through idx_jobs_finished. `now` and `since` come back with every row.
WITH clock AS (
    SELECT CAST(extract(epoch FROM now()) AS float8) AS now, CAST(:width AS float8) AS width
), span AS (
    SELECT now, width, (floor(now / width) - :back) * width AS since FROM clock
)
SELECT s.now, s.since, b.bucket, b.completed, b.failed, b.latency
FROM span AS s
LEFT JOIN LATERAL (
    SELECT floor(CAST(extract(epoch FROM j.completed_at) AS float8) / s.width) * s.width
               AS bucket,
           count(*) FILTER (WHERE j.status = 'completed') AS completed,
           count(*) FILTER (WHERE j.status = 'failed') AS failed,
           percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (
               ORDER BY extract(epoch FROM j.completed_at - greatest(j.created_at, j.run_at)))
               FILTER (WHERE j.status = 'completed') AS latency
    FROM jobqueue_all_jobs AS j
    WHERE j.completed_at >= to_timestamp(s.since)
    GROUP BY 1
) AS b ON true
ORDER BY b.bucket;

-- dashboard_completed --
-- A page of completed jobs, last completed first, of one queue and type if
-- given, after the keyset (:before_at, :before_id) (the last row of the
-- previous page; 'infinity' for the first). Through idx_jobs_finished,
-- which also holds the few failed jobs. The status is written out, not a
-- parameter, here and below, so that a generic plan can use the partial
-- index it implies.
SELECT id, job_type, queue, priority, status, retry_count, max_retries, error_message,
       run_at, created_at, started_at, completed_at,
       jsonb_array_length(error_history) + 1 AS attempts, completed_at AS at
FROM jobqueue_all_jobs
WHERE status = 'completed' AND completed_at IS NOT NULL
  AND (CAST(:queue AS text) IS NULL OR queue = CAST(:queue AS text))
  AND (CAST(:job_type AS text) IS NULL OR job_type = CAST(:job_type AS text))
  AND (completed_at, id) < (CAST(:before_at AS timestamptz), CAST(:before_id AS uuid))
ORDER BY completed_at DESC, id DESC
LIMIT :limit;

-- dashboard_failed --
-- A page of jobs failed for good, last failed first (as dashboard_completed,
-- through idx_jobs_failed).
SELECT id, job_type, queue, priority, status, retry_count, max_retries, error_message,
       run_at, created_at, started_at, completed_at,
       jsonb_array_length(error_history) AS attempts, completed_at AS at
FROM jobqueue_all_jobs
WHERE status = 'failed'
  AND (CAST(:queue AS text) IS NULL OR queue = CAST(:queue AS text))
  AND (CAST(:job_type AS text) IS NULL OR job_type = CAST(:job_type AS text))
  AND (completed_at, id) < (CAST(:before_at AS timestamptz), CAST(:before_id AS uuid))
ORDER BY completed_at DESC, id DESC
LIMIT :limit;

-- dashboard_running --
-- A page of the jobs workers hold now, last started first (through
-- idx_jobs_processing: as many as the workers' lanes hold, never many).
-- The jobs quick batches hold are not marked: the page adds them (`held`).
SELECT id, job_type, queue, priority, status, retry_count, max_retries, error_message,
       run_at, created_at, started_at, completed_at,
       jsonb_array_length(error_history) + 1 AS attempts, started_at AS at, worker_id
FROM jobs
WHERE status = 'processing'
  AND (CAST(:queue AS text) IS NULL OR queue = CAST(:queue AS text))
  AND (CAST(:job_type AS text) IS NULL OR job_type = CAST(:job_type AS text))
  AND (started_at, id) < (CAST(:before_at AS timestamptz), CAST(:before_id AS uuid))
ORDER BY started_at DESC, id DESC
LIMIT :limit;

-- dashboard_waiting --
-- A page of waiting jobs (pending or retrying, due or not) in the order
-- workers take them: queue by queue, then priority (highest first), then
-- due time; the id breaks ties. The keyset (:queue, :priority, :run_at, :id)
-- is the last row of the previous page; it is split three ways so that
-- each arm is a range of idx_jobs_waiting read up to the page's length:
-- the rest of that priority in that queue, the lower priorities of that
-- queue, the queues after it (left out when :one_queue). First page:
-- :queue '' (or the one queue) and :priority above the largest.
SELECT id, job_type, queue, priority, status, retry_count, max_retries, error_message,
       run_at, created_at, started_at, completed_at, attempts, run_at AS at
FROM ((SELECT 1 AS arm, id, job_type, queue, priority, status, retry_count, max_retries,
              error_message, run_at, created_at, started_at, completed_at,
              jsonb_array_length(error_history) AS attempts
       FROM jobs
       WHERE status IN ('pending', 'retrying') AND queue = :queue AND priority = :priority
         AND (run_at, id) > (CAST(:run_at AS timestamptz), CAST(:id AS uuid))
         AND (CAST(:job_type AS text) IS NULL OR job_type = CAST(:job_type AS text))
       ORDER BY run_at, id
       LIMIT :limit)
      UNION ALL
      (SELECT 2, id, job_type, queue, priority, status, retry_count, max_retries,
              error_message, run_at, created_at, started_at, completed_at,
              jsonb_array_length(error_history)
       FROM jobs
       WHERE status IN ('pending', 'retrying') AND queue = :queue AND priority < :priority
         AND (CAST(:job_type AS text) IS NULL OR job_type = CAST(:job_type AS text))
       ORDER BY priority DESC, run_at, id
       LIMIT :limit)
      UNION ALL
      (SELECT 3, id, job_type, queue, priority, status, retry_count, max_retries,
              error_message, run_at, created_at, started_at, completed_at,
              jsonb_array_length(error_history)
       FROM jobs
       WHERE status IN ('pending', 'retrying') AND queue > :queue AND NOT :one_queue
         AND (CAST(:job_type AS text) IS NULL OR job_type = CAST(:job_type AS text))
       ORDER BY queue, priority DESC, run_at, id
       LIMIT :limit)) AS page
ORDER BY arm, queue, priority DESC, run_at, id
LIMIT :limit;

-- session_start --
-- A dashboard login (`jobqueue/ops/dashboard/auth.py`): the digest of its
-- cookie's secret, until it expires. Logins that expired are cleared on the
-- way, so the table holds about as many rows as there are open sessions.
WITH cleared AS (
    DELETE FROM jobqueue_sessions WHERE expires_at <= now()
)
INSERT INTO jobqueue_sessions (digest, expires_at)
VALUES (:digest, now() + make_interval(secs => :seconds));

-- session_valid --
-- Whether a cookie's session is open: found, and not expired.
SELECT EXISTS (SELECT FROM jobqueue_sessions WHERE digest = :digest AND expires_at > now());

-- session_end --
-- Logging out: the session ends for every process that serves the dashboard.
DELETE FROM jobqueue_sessions WHERE digest = :digest;

-- read_timeout --
-- The statement timeout of an operator's read (the API, the dashboard), for
-- the rest of its transaction only: the connection may be the caller's own.
SELECT set_config('statement_timeout', :timeout, true);
