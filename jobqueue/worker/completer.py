"""Recording a batch's outcomes on the lane's connection, in the batch's
transaction: one `complete`, one `fail`, one `snooze` and one `hand_back`
statement for the whole batch, whatever its size. Each checks that this
worker still holds the jobs (`LostOwnership` if another worker took one:
nothing of the batch may commit). Sync jobs record theirs in their threads
(`threads.py`), with the same statements.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from jobqueue.schema.queries import queries
from jobqueue.worker.batch import BatchKind
from jobqueue.worker.handler import ClaimedJob
from jobqueue.worker.outcome import Outcomes


class LostOwnership(Exception):
    """Another worker took jobs of this batch: none of its effects may commit."""


async def record(raw: Any, worker_id: int, out: Outcomes, batch: BatchKind,
                 jobs: list[ClaimedJob]) -> list[float]:
    """Write a batch's outcomes in its transaction; the successes' latencies."""
    taken = batch.taken
    latencies: list[float] = []
    if out.done_ids:
        latencies = await _complete(raw, worker_id, out, taken, jobs)
    if out.failed_ids:
        rows = await queries["fail"].fetch(
            raw, ids=out.failed_ids, errors=out.errors, delays=out.delays,
            retry=out.retry, traces=out.traces, worker_id=worker_id, taken=taken)
        if len(rows) != len(out.failed_ids):
            raise LostOwnership
    if out.snoozed_ids:
        rows = await queries["snooze"].fetch(
            raw, ids=out.snoozed_ids, delays=out.snoozes, worker_id=worker_id, taken=taken)
        if len(rows) != len(out.snoozed_ids):
            raise LostOwnership
    unfinished = batch.to_hand_back(out.not_started)
    if unfinished:
        await queries["hand_back"].fetch(raw, ids=unfinished, worker_id=worker_id)
    return latencies


async def _complete(raw: Any, worker_id: int, out: Outcomes, taken: bool,
                    jobs: list[ClaimedJob]) -> list[float]:
    """Record the successes (`complete`) by where their rows were when the
    batch got them: a taken batch's where `take` locked them
    (`complete_taken`), a claimed one's where `claim` wrote them
    (`complete_claimed`); by id only those whose row moved since (a handler
    that updated its own job), or that came without an address (a limited
    queue's, a lone job's)."""
    ids, results = out.done_ids, out.results
    latencies: list[float] = []
    tid_of = {job.id: job.tid for job in jobs}
    tids = [tid for tid in map(tid_of.get, ids) if tid is not None]
    if len(tids) == len(ids):
        rows = await queries["complete_taken" if taken else "complete_claimed"].fetch(
            raw, ids=ids, results=results if any(r is not None for r in results) else None,
            tids=tid_array(tids), worker_id=worker_id)
        latencies = [row["latency"] for row in rows]
        if len(rows) == len(ids):
            return latencies
        found = {row["id"] for row in rows}
        moved = [i for i, job_id in enumerate(ids) if job_id not in found]
        ids, results = [ids[i] for i in moved], [results[i] for i in moved]
    rows = await queries["complete"].fetch(
        raw, ids=ids, results=results, worker_id=worker_id, taken=taken)
    if len(rows) != len(ids):
        raise LostOwnership
    return latencies + [row[0] for row in rows]


def tid_array(tids: Iterable[tuple[int, int]]) -> str:
    """Row addresses as the text of a `tid[]`. asyncpg's binary encoding of a
    list of (block, offset) tuples cost the worker about 1.4 µs a job (1,000
    a quick batch); this text, which the server parses, about 0.5 µs."""
    return "{" + ",".join([f'"({block},{offset})"' for block, offset in tids]) + "}"
