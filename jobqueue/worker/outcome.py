"""What became of a job: the typed outcome of one attempt, a batch's outcomes
in the shape the SQL records them, and the rules that decide them, the same
for async handlers (`executor.py`) and sync ones (`threads.py`): a failure is
retried after the retry policy's backoff while retries are left, a stop by
a timeout is a failure, a cancel fails for good, a `Snooze` is due again
without counting the attempt. Each is logged once, when decided.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from jobqueue.registry import HandlerRegistry
from jobqueue.retry import RetryPolicy
from jobqueue.schema.locks import CANCELLED
from jobqueue.schema.models import ERROR_MESSAGE_MAX_LENGTH
from jobqueue.worker.handler import ClaimedJob, Snooze, error_text, traceback_text

logger = logging.getLogger("jobqueue.worker")

DONE, FAILED, SNOOZED = "done", "failed", "snoozed"


class Decided(NamedTuple):
    """An outcome recorded without running the job (again): in a rerun of the
    batch, a success that never touched the database (nothing of it was
    rolled back), a failure or a snooze (its writes are gone either way); or
    a job cancelled before it started. `logged`: said already."""

    kind: str  # DONE, FAILED or SNOOZED
    value: str | None  # the encoded result, or the error
    seconds: float | None  # handler time, for a success
    retry: bool  # a failure: tried again (else failed for good)
    delay: float  # a failure's backoff, or a snooze's
    logged: bool
    trace: str | None = None  # a failure's traceback (`handler.traceback_text`)


@dataclass
class Outcomes:
    """What happened to the jobs of one batch, in the shape the SQL wants."""

    done_ids: list[uuid.UUID] = field(default_factory=list)
    results: list[str | None] = field(default_factory=list)
    handler_times: list[float] = field(default_factory=list)
    failed_ids: list[uuid.UUID] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    delays: list[float] = field(default_factory=list)
    retry: list[bool] = field(default_factory=list)
    traces: list[str | None] = field(default_factory=list)
    snoozed_ids: list[uuid.UUID] = field(default_factory=list)
    snoozes: list[float] = field(default_factory=list)
    not_started: list[uuid.UUID] = field(default_factory=list)

    def success(self, job_id: uuid.UUID, result: str | None, seconds: float) -> None:
        self.done_ids.append(job_id)
        self.results.append(result)
        self.handler_times.append(seconds)

    def failure(self, job_id: uuid.UUID, error: str, retry: bool, delay: float,
                trace: str | None = None) -> None:
        self.failed_ids.append(job_id)
        self.errors.append(error[:ERROR_MESSAGE_MAX_LENGTH])
        self.retry.append(retry)
        self.delays.append(delay)
        self.traces.append(trace)

    def snooze(self, job_id: uuid.UUID, seconds: float) -> None:
        self.snoozed_ids.append(job_id)
        self.snoozes.append(seconds)

    def waiting_again(self) -> list[uuid.UUID]:
        """The jobs this batch leaves waiting: to be retried, snoozed, or not
        started (handed back, or released at the commit)."""
        return [*(job_id for job_id, retry in zip(self.failed_ids, self.retry, strict=True)
                  if retry), *self.snoozed_ids, *self.not_started]

    def take_out(self, ids: set[uuid.UUID]) -> None:
        """Forget what was decided for `ids` (they are decided again)."""
        self.done_ids, self.results, self.handler_times = _without(
            ids, self.done_ids, self.results, self.handler_times)
        self.failed_ids, self.errors, self.delays, self.retry, self.traces = _without(
            ids, self.failed_ids, self.errors, self.delays, self.retry, self.traces)
        self.snoozed_ids, self.snoozes = _without(ids, self.snoozed_ids, self.snoozes)
        self.not_started = [job_id for job_id in self.not_started if job_id not in ids]

    def add(self, job_id: uuid.UUID, outcome: Decided) -> None:
        if outcome.kind == DONE:
            self.success(job_id, outcome.value, outcome.seconds or 0.0)
        elif outcome.kind == FAILED:
            self.failure(job_id, outcome.value or "", outcome.retry, outcome.delay,
                         outcome.trace)
        else:
            self.snooze(job_id, outcome.delay)


def _without(ids: set[uuid.UUID], keys: list[uuid.UUID], *columns: list[Any]
             ) -> tuple[list[Any], ...]:
    """`keys` and the columns that go with them, less the rows of `ids`."""
    keep = [n for n, job_id in enumerate(keys) if job_id not in ids]
    return tuple([column[n] for n in keep] for column in (keys, *columns))


def cancelled(trace: str | None = None) -> Decided:
    """A job cancelled: failed for good, error `cancelled`, whatever retries
    it has left (`trace`: the traceback of the attempt it made, if it failed)."""
    return Decided(FAILED, CANCELLED, None, False, 0.0, False, trace)


def overturn(jobs: Iterable[ClaimedJob], out: Outcomes, cancels: set[uuid.UUID],
             worker_id: int) -> set[uuid.UUID]:
    """Apply the cancels heard while a batch ran to the outcomes it decided
    before them, as long as nothing is recorded: a job that was to wait
    again (its attempt failed and would be retried, it snoozed, the batch
    did not start it) or that succeeded fails for good, `cancelled`, instead
    (the caller takes a success's writes away). A failure for good stands:
    the job has ended. The ids whose outcome changed."""
    ids = cancels.intersection(out.done_ids)
    ids.update(job_id for job_id in out.waiting_again() if job_id in cancels)
    if not ids:
        return ids
    traces = {job_id: trace for job_id, trace in zip(out.failed_ids, out.traces, strict=True)
              if job_id in ids}
    out.take_out(ids)
    for job in jobs:
        if job.id in ids:
            note(job, cancelled(traces.get(job.id)), out, worker_id)
    return ids


def timeout_of(job: ClaimedJob, registry: HandlerRegistry) -> float | None:
    """The job's own timeout, else its type's default (`register(timeout=)`)."""
    return job.timeout if job.timeout is not None else registry.timeout(job.job_type)


def failure(job: ClaimedJob, error: str, policy: RetryPolicy, final: bool = False,
            seconds: float | None = None, trace: str | None = None) -> Decided:
    """A failed attempt: retried after its backoff, or failed for good
    (`final`: whatever retries are left)."""
    retry = not final and job.retry_count < job.max_retries
    delay = policy.delay(job.attempt) if retry else 0.0
    return Decided(FAILED, error, seconds, retry, delay, False, trace)


def outcome_of(job: ClaimedJob, exc: Exception, stopped: str | None, seconds: float,
               policy: RetryPolicy) -> Decided:
    """What a handler's exception makes of its attempt: stopped (`stopped`,
    the reason) by its timeout (a failure) or a cancel (failed for good), a
    snooze, or a failure, which keeps its traceback."""
    if stopped is not None:
        return failure(job, stopped, policy, final=stopped == CANCELLED, seconds=seconds)
    if isinstance(exc, Snooze):
        return Decided(SNOOZED, None, seconds, False, exc.seconds, False)
    return failure(job, error_text(exc), policy, seconds=seconds, trace=traceback_text(exc))


def note(job: ClaimedJob, outcome: Decided, out: Outcomes, worker_id: int) -> None:
    """Add a job's outcome to its batch's, and say what became of it (once:
    a rerun's kept outcomes were said the first time; a success is said
    when its batch has committed, `log_completed`). A failure's traceback
    goes with it as the `traceback` field, as stored: text PostgreSQL and
    a log file can hold (`exc_info` would print the exception's raw text),
    printed below the line by the CLI's text format (`ops/logs.py`)."""
    out.add(job.id, outcome)
    if outcome.logged or outcome.kind == DONE:
        return
    seconds = outcome.seconds
    duration = None if seconds is None else round(seconds * 1000, 3)
    if outcome.kind == SNOOZED:
        logger.info("job %s (%s) attempt %d snoozed for %gs", job.id, job.job_type,
                    job.attempt, outcome.delay,
                    extra={"event": "job_snoozed", "job_id": str(job.id),
                           "job_type": job.job_type, "attempt": job.attempt,
                           "duration_ms": duration, "worker_id": worker_id,
                           "snooze_s": outcome.delay})
        return
    retry, delay, error = outcome.retry, outcome.delay, outcome.value
    logger.warning("job %s (%s) attempt %d failed%s: %s", job.id, job.job_type,
                   job.attempt, f", retry in {delay:.2f}s" if retry else "", error,
                   extra={"event": "job_failed", "job_id": str(job.id),
                          "job_type": job.job_type, "attempt": job.attempt,
                          "duration_ms": duration, "worker_id": worker_id,
                          "retry": retry, "retry_in_s": round(delay, 3) if retry else None,
                          "error": error, "traceback": outcome.trace})


def failed_at_commit(job: ClaimedJob, exc: Exception, policy: RetryPolicy,
                     worker_id: int) -> Outcomes:
    """A job that could not commit even alone fails without its writes, its
    attempt counted."""
    out = Outcomes()
    error = error_text(exc)
    outcome = failure(job, error, policy, trace=traceback_text(exc))
    out.add(job.id, outcome)
    logger.warning("job %s (%s) attempt %d failed at commit: %s", job.id, job.job_type,
                   job.attempt, error,
                   extra={"event": "job_failed", "job_id": str(job.id),
                          "job_type": job.job_type, "attempt": job.attempt,
                          "worker_id": worker_id, "retry": outcome.retry, "error": error,
                          "traceback": outcome.trace})
    return out


def log_completed(jobs: list[ClaimedJob], out: Outcomes, worker_id: int) -> None:
    """One DEBUG event per completed job of a committed batch (at INFO the
    worker logs a summary every `summary_interval` instead: a line per job
    would cost a no-op worker half its speed)."""
    if not out.done_ids or not logger.isEnabledFor(logging.DEBUG):
        return
    by_id = {job.id: job for job in jobs}
    for job_id, seconds in zip(out.done_ids, out.handler_times, strict=True):
        job = by_id[job_id]
        ms = round(seconds * 1000, 3)
        logger.debug("job %s (%s) attempt %d completed in %.1f ms", job.id, job.job_type,
                     job.attempt, ms,
                     extra={"event": "job_completed", "job_id": str(job.id),
                            "job_type": job.job_type, "attempt": job.attempt,
                            "duration_ms": ms, "worker_id": worker_id})
