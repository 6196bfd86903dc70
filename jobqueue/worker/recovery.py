"""What a lane does when a batch's transaction rolls back instead of
committing: which transactions its jobs run in next.

A batch runs as a list of attempts, each one transaction (`AsyncExecutor.run`
loops over them); an attempt that rolls back gives the attempts that follow:

- **a rerun** (`Rerun`): a job that ran without a savepoint failed after
  touching the database, or its session rolled back writes: that cannot be
  undone alone, so the batch runs again with every job in a savepoint of its
  own. Outcomes that nothing rolled back are kept (`decided_of`); the jobs
  before the culprit that wrote run a second time (their writes still commit
  once; what they did outside the database happens twice). The culprit's
  type runs in savepoints in this worker from then on, so this happens once
  per type.
- **a cancel** (`after_cancel`): jobs whose handlers had succeeded after
  writing were cancelled before the batch committed (`outcome.overturn`):
  their writes go only with the batch's, so it rolls back and runs again,
  those jobs failed `cancelled` and every outcome nothing rolled back kept;
  the other jobs that wrote run a second time, as in a rerun.
- **a split** (`after_error`): the batch could not be recorded or committed
  (a deferred constraint a handler broke, say): its jobs run again one per
  transaction, so the culprit fails alone; a job that still cannot commit
  alone is failed without its writes, its attempt counted.

A lost connection or ownership ends the batch instead (the lane hands its
jobs back), so the attempts always come to an end: a rerun runs everything
isolated (it cannot rerun again), a cancel's rerun decides at least one job
more for good, a split runs single jobs, and a single job's failure is
recorded without running anything.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field

from jobqueue.errors import one_line
from jobqueue.worker.handler import ClaimedJob
from jobqueue.worker.outcome import DONE, FAILED, SNOOZED, Decided, Outcomes

logger = logging.getLogger("jobqueue.worker")


@dataclass
class Attempt:
    """One transaction of a batch's jobs: the first, or one after a rollback."""

    jobs: list[ClaimedJob]
    #: Every job in a savepoint of its own (else only the types that need one).
    isolated: bool = False
    #: Outcomes kept from the attempt before: recorded without running those jobs.
    decided: dict[uuid.UUID, Decided] = field(default_factory=dict)
    #: The one job could not commit even alone: record this failure, run nothing.
    failed: Exception | None = None


class Rerun(Exception):
    """A plain job's writes cannot be undone alone: the batch must run again,
    isolated. `outcome`: the job's own, kept for the rerun (a failed attempt,
    a snooze); None: it succeeded but its session rolled back after writing,
    so it runs again too."""

    def __init__(self, job: ClaimedJob, outcome: Decided | None) -> None:
        super().__init__(None if outcome is None else outcome.value)
        self.job = job
        self.outcome = outcome
        #: Filled in by `AsyncExecutor._run_jobs`: what the rerun keeps, and how many
        #: jobs that already ran must run again (they wrote, and it was lost).
        self.decided: dict[uuid.UUID, Decided] = {}
        self.again = 0


def decided_of(out: Outcomes, touched_ids: set[uuid.UUID], rerun: Rerun
               ) -> tuple[dict[uuid.UUID, Decided], int]:
    """What a rerun keeps of a batch's first run (`kept_of`), and the
    culprit's own outcome; also how many jobs that ran must run again."""
    kept, again = kept_of(out, touched_ids)
    if rerun.outcome is not None:
        kept[rerun.job.id] = rerun.outcome
    else:
        again += 1  # the culprit itself: it succeeded, but its rollback must be honoured
    return kept, again


def kept_of(out: Outcomes, touched_ids: set[uuid.UUID]
            ) -> tuple[dict[uuid.UUID, Decided], int]:
    """What a batch that rolls back keeps of what it decided (`out`): every
    failure and snooze (their writes are gone either way: they had none, or
    their savepoints took them back) and the successes that never touched
    the database. Also how many successes wrote and must run again."""
    kept = {job_id: Decided(FAILED, error, None, retry, delay, True, trace)
            for job_id, error, retry, delay, trace in zip(
                out.failed_ids, out.errors, out.retry, out.delays, out.traces, strict=True)}
    kept.update({job_id: Decided(SNOOZED, None, None, False, seconds, True)
                 for job_id, seconds in zip(out.snoozed_ids, out.snoozes, strict=True)})
    again = 0
    for job_id, result, seconds in zip(out.done_ids, out.results, out.handler_times,
                                       strict=True):
        if job_id in touched_ids:
            again += 1
        else:
            kept[job_id] = Decided(DONE, result, seconds, False, 0.0, True)
    return kept, again


def after_rerun(jobs: list[ClaimedJob], rerun: Rerun, worker_id: int) -> list[Attempt]:
    """The batch again, every job isolated, keeping what `rerun` decided."""
    culprit = rerun.job
    logger.warning("job %s (%s) %s after touching the database, in a batch run without "
                   "savepoints: the batch rolled back and runs again, each job in a "
                   "savepoint (%d job(s) that ran already run a second time, %d kept "
                   "as they were); %s jobs run in savepoints from now on",
                   culprit.id, culprit.job_type, _what_happened(rerun.outcome), rerun.again,
                   len(rerun.decided), culprit.job_type,
                   extra={"event": "batch_rerun", "job_id": str(culprit.id),
                          "job_type": culprit.job_type, "jobs": len(jobs),
                          "rerun": rerun.again, "worker_id": worker_id})
    return [Attempt(jobs, isolated=True, decided=rerun.decided)]


def after_cancel(attempt: Attempt, out: Outcomes, touched_ids: set[uuid.UUID],
                 cancelled: set[uuid.UUID], worker_id: int) -> tuple[list[Attempt], int]:
    """The batch again, keeping what it decided (`cancelled` now among its
    failures), after jobs that had succeeded and written were cancelled
    before it committed: only its rollback takes their writes away, and the
    jobs that wrote beside them run again. Also how many run again."""
    kept, again = kept_of(out, touched_ids)
    logger.warning("job(s) %s cancelled after their handler returned, before their batch "
                   "committed: the batch rolled back and runs again without them (%d job(s) "
                   "that wrote run a second time, %d kept as they were)",
                   ", ".join(sorted(map(str, cancelled))), again, len(kept),
                   extra={"event": "batch_rerun", "job_ids": sorted(map(str, cancelled)),
                          "cause": "cancel", "jobs": len(attempt.jobs), "rerun": again,
                          "worker_id": worker_id})
    return [Attempt(attempt.jobs, isolated=attempt.isolated, decided=kept)], again


def after_error(attempt: Attempt, exc: Exception, worker_id: int) -> list[Attempt]:
    """Each job of the batch alone; a job alone, failed without running."""
    jobs = attempt.jobs
    if len(jobs) == 1:
        return [Attempt(jobs, failed=exc)]
    logger.warning("batch of %d could not commit (%s); running its jobs one by one",
                   len(jobs), one_line(exc),
                   extra={"event": "batch_split", "jobs": len(jobs),
                          "worker_id": worker_id, "error": one_line(exc)})
    return [Attempt([job], isolated=True, decided=attempt.decided) for job in jobs]


def _what_happened(outcome: Decided | None) -> str:
    """A rerun's culprit, in words."""
    if outcome is None:
        return "rolled its session back"
    return "snoozed" if outcome.kind == SNOOZED else "failed"
