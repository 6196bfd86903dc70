"""The worker: what runs jobs.

`runner` (a worker's life: connections, locks, standby, takeover, stop) runs
`lane`s, sharing a `life`. A lane takes batches from the queues it serves,
in turn (`book`: which queues have waiting jobs, which are paused or
limited; `floors`: where its claims start), as its executor plans them
(`pacing`), each held one of two ways (`batch`: taken or claimed, each with
its own hand-back rule), and hands each to its executor: `executor` runs
async handlers in the batch's transaction on the lane's connection, judging
each job's `outcome` and recording them all (`completer`), and runs the batch
again after a rollback as `recovery` says; `threads` runs sync (plain `def`)
handlers in a bounded `pool` of threads. `handler` is what a handler sees (its
session and the hooks behind it, `current_job()`, `Snooze`); `interrupt`
stops one running handler (its timeout, a cancel); `upkeep` keeps the worker
alive and the queue clean (heartbeat and fencing, rescue and pruning);
`stats` counts. Every part is given a `WorkerConfig` (`config`) and the few
things it needs, never the runner.
"""

from jobqueue.schema.locks import ACTIVE_KEY, LOCK_CLASS, WORKER_LOCK_CLASS
from jobqueue.worker.config import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_CONCURRENCY,
    DEFAULT_THREADS,
    SAVEPOINT_MODES,
    WorkerConfig,
)
from jobqueue.worker.handler import Snooze, current_job
from jobqueue.worker.runner import JobRunner

__all__ = [
    "ACTIVE_KEY",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_CONCURRENCY",
    "DEFAULT_THREADS",
    "LOCK_CLASS",
    "SAVEPOINT_MODES",
    "WORKER_LOCK_CLASS",
    "JobRunner",
    "Snooze",
    "WorkerConfig",
    "current_job",
]
