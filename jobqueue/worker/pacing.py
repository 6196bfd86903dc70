"""How big a lane's next batch is, and how it holds its jobs: pure arithmetic
on what the lane's recent batches took, with no database and no clock of its
own (the lane passes the seconds in), so every rule is a unit test.

Two ways to take a batch (`batch.py` has each way's rule for jobs the lane
will not finish):

- **taken**, a *quick batch*: jobs faster than `quick_batch` (50 ms by
  default) are locked inside the batch's own transaction, as many as should
  finish within `quick_batch` (at most `batch_size`). One commit for all.
- **claimed**: slower jobs, one per batch, committed as `processing` before
  they run, so `processing` means running and no transaction stays open
  across many slow jobs. A lane that has not run anything yet claims one job
  to learn the pace; so does a lane whose last claim saw no other job due
  (`lone`): what it finds next most likely arrived alone, and a claimed batch
  of one costs two round trips (its claim, then its outcome in autocommit,
  `batch.Deferred`) where a quick batch costs five.

Jobs that write open a savepoint each; a batch never opens more than
PostgreSQL caches per transaction (SAVEPOINT_LIMIT, 64).
"""

from __future__ import annotations

from typing import NamedTuple

#: Savepoints one transaction may open before PostgreSQL spills its
#: subtransaction cache to disk (PGPROC_MAX_CACHED_SUBXIDS).
SAVEPOINT_LIMIT = 64

#: Weight of the newest batch in the running estimates.
_WEIGHT = 0.3


class Plan(NamedTuple):
    """How a lane takes its next batch (`Pacing.plan`)."""

    #: True: a quick batch, taken (locked) inside its own transaction;
    #: False: claimed (committed as `processing`) before it runs.
    take: bool
    #: Most jobs in it.
    limit: int


class Pacing:
    """One lane's running estimates, and the plans and stops they make."""

    def __init__(self, batch_size: int, quick_batch: float) -> None:
        self.batch_size = batch_size
        #: 0: never take a quick batch (claimed batches of up to batch_size).
        self.quick_batch = quick_batch
        #: Recent seconds a job takes to run (its handler and savepoint; the
        #: batch's own statements are left out, or a lone job's commit would
        #: count as if each job of a full batch paid it); None until a batch ran.
        self.per_job: float | None = None
        #: Recent savepoints a job opens (0 for jobs that never touch the database).
        self.savepoints_per_job = 0.0
        #: The most savepoints one job of each type has opened (at most SAVEPOINT_LIMIT).
        self.savepoint_peak: dict[str, int] = {}

    def plan(self, lone: bool) -> Plan:
        """Taken or claimed, and how many jobs at most (module doc). `lone`:
        the lane's last claim saw no other job due where it took."""
        limit = self.batch_size
        if self.savepoints_per_job > 0:
            limit = min(limit, max(1, int(SAVEPOINT_LIMIT / self.savepoints_per_job)))
        if self.quick_batch == 0:
            return Plan(False, limit)
        if lone or self.per_job is None or self.per_job > self.quick_batch:
            return Plan(False, 1)
        if self.per_job > 0:
            limit = min(limit, int(self.quick_batch / self.per_job))
        return Plan(True, max(1, limit))

    def full(self, taken: bool, elapsed: float, savepoints: int, job_type: str) -> bool:
        """Must the batch stop before the next job (of `job_type`), `elapsed`
        seconds and `savepoints` savepoints into it? A quick batch that
        outruns quick_batch (slow jobs after fast ones) stops early: its
        untouched jobs are released at the commit, and the pace now says to
        claim them. A batch that has opened savepoints stops before a job that
        could take it past SAVEPOINT_LIMIT (judged by the most its type has
        opened, and at least one)."""
        if savepoints and savepoints + max(1, self.savepoint_peak.get(job_type, 0)
                                           ) > SAVEPOINT_LIMIT:
            return True
        return taken and elapsed > self.quick_batch

    def opened(self, job_type: str, savepoints: int) -> None:
        """A job of `job_type` opened `savepoints` savepoints."""
        used = min(savepoints, SAVEPOINT_LIMIT)
        if used > self.savepoint_peak.get(job_type, 0):
            self.savepoint_peak[job_type] = used

    def ran(self, seconds: float, jobs: int, savepoints: int) -> None:
        """Fold a batch's run time and savepoints into the estimates. At most
        one savepoint a job counts: a job that opens many of its own (it
        overflows alone) must not shrink the batches of the jobs after it."""
        per_job = seconds / jobs
        self.per_job = per_job if self.per_job is None else (
            _WEIGHT * per_job + (1 - _WEIGHT) * self.per_job)
        self.savepoints_per_job = (_WEIGHT * min(1.0, savepoints / jobs)
                                   + (1 - _WEIGHT) * self.savepoints_per_job)
