"""Keeping the cancels a worker hears.

`jobqueue.control.cancel` fails a waiting job at once; a job a worker holds
(claimed, or locked by a quick batch) is asked of the workers instead, by a
notification that names it, and the answer says the worker was asked. From
then on the worker owns the cancel: the job must end `failed`, error
`cancelled`, with none of its handler's writes committed, wherever in the
worker it is. The places, and who keeps it in each:

- **claimed, its reply not yet read** (the notification overtook it): the
  lane keeps what it hears while a claim is on its way (`Lane._claim`);
- **waiting in its batch**: the lane keeps the cancels of its batch's jobs
  (`Lane.interrupt`), and the batch fails the job instead of running it;
- **running**: its handler is stopped (`interrupt.py`, `pool.py`), its
  writes roll back;
- **decided, not yet recorded** (its handler returned, or failed and would
  be retried, or snoozed, or the batch stopped before it, and the batch is
  still running others): the outcome is overturned before the batch writes
  its outcomes (`outcome.overturn`); a job that had succeeded after writing
  takes the batch back with it (`recovery.after_cancel`);
- **let go still waiting** (a retry or snooze recorded while the cancel was
  on its way, the jobs a batch did not start, a batch rolled back and taken
  again without it, a stop that hands jobs back): the cancel is sent again
  (`JobRunner.pass_on`: the job is cancelled where it waits, or asked of the
  worker that took it since), and for a while the worker remembers the jobs
  it let go (`Released`), for a cancel whose statement saw the job still
  held and whose notification arrives after.

What no worker can keep: a job whose handler returned and whose batch was
already writing its outcomes when the cancel came has finished first (its
outcome stands, and `wait` says so); a worker that loses its connection
forgets what it heard (its jobs go back to the queue, or to a rescue).
None of this costs a job anything: the cancels are looked at once per batch,
and only when there are some.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable

#: How long a worker remembers a job it let go still waiting (seconds): far
#: longer than a cancel statement that saw the job held takes to notify.
LINGER = 10.0


class Released:
    """The jobs this worker let go still waiting in the last `linger`
    seconds: a cancel for one of them that no lane holds any more was sent
    while the worker still held it, and is sent again (`JobRunner.cancel`)."""

    def __init__(self, linger: float = LINGER) -> None:
        self.linger = linger
        #: Job id -> when it is forgotten, oldest first.
        self._until: dict[uuid.UUID, float] = {}

    def add(self, ids: Iterable[uuid.UUID]) -> None:
        now = time.monotonic()
        until, stale = self._until, []
        for job_id, expiry in until.items():
            if expiry > now:
                break
            stale.append(job_id)
        for job_id in stale:
            del until[job_id]
        expiry = now + self.linger
        for job_id in ids:
            until.pop(job_id, None)  # to the end: the order is the expiries'
            until[job_id] = expiry

    def discard(self, ids: Iterable[uuid.UUID]) -> None:
        for job_id in ids:
            self._until.pop(job_id, None)

    def take(self, job_id: uuid.UUID) -> bool:
        """Was `job_id` let go in the last `linger` seconds? Forgotten now."""
        expiry = self._until.pop(job_id, None)
        return expiry is not None and expiry > time.monotonic()

    def __len__(self) -> int:
        return len(self._until)
