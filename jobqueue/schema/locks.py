"""The advisory locks and the channel jobqueue uses, in one place.

Advisory locks are named by two 32-bit integers (class, key). jobqueue owns
three classes; pick other numbers for your own locks in the same database.
"""

#: Class of the queue's own locks.
LOCK_CLASS = 74_171
#: Key of the lock only the one active worker holds (exclusive mode).
ACTIVE_KEY = 0
#: Key of the lock the maintenance leader holds (rescue, pruning).
LEADER_KEY = 1
#: Class of liveness locks: each worker holds (WORKER_LOCK_CLASS, its id) for
#: as long as it lives, on its own connection.
WORKER_LOCK_CLASS = 74_172
#: Class of the locks that admit claimers to a limited queue one at a time
#: (key: hashtext of the queue's name; two queues sharing a hash only wait
#: for each other a little).
QUEUE_LOCK_CLASS = 74_173
#: The channel new jobs are announced on (a trigger on `jobs` notifies it).
CHANNEL = "jobqueue"
#: A notification on CHANNEL whose payload is this prefix and a job's id asks
#: the worker running that job to stop it (`jobqueue cancel`, `DELETE /jobs/{id}`;
#: `queries.sql: cancel` sends it).
CANCEL_PREFIX = "cancel:"
#: The channel a finished job is announced on, its id as the payload, when a
#: caller of `jobqueue.wait()` waits for it (`complete`, `fail`, `cancel`, `rescue`).
DONE_CHANNEL = "jobqueue_done"
#: The error_message of a job cancelled (waiting, or stopped while it ran):
#: nothing else, so that tools can match it (a reason may follow, `: why`).
CANCELLED = "cancelled"
