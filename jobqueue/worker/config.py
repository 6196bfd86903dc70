"""A worker's settings: one frozen object, checked once, handed to the parts
that need them (the runner, its lanes, its upkeep) instead of each part
reaching into the runner for its attributes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jobqueue.enqueue import check_queue
from jobqueue.retry import RetryPolicy

DAY = 86_400.0
#: Most jobs a lane takes at once unless told otherwise (the CLI's default too).
DEFAULT_BATCH_SIZE = 1000
#: Lanes a worker runs unless told otherwise: while one waits for the
#: database, the other runs its handlers (measured in BENCHMARKS.md: no-op
#: and one-row jobs alike drain faster with two lanes than with one).
DEFAULT_CONCURRENCY = 2
SAVEPOINT_MODES = ("auto", "always")
#: Sync handlers running at once unless told otherwise: enough to overlap a
#: few blocking calls (HTTP, S3) without holding many connections; each
#: thread has a connection of its own while it runs a job.
DEFAULT_THREADS = 4


@dataclass(frozen=True)
class WorkerConfig:
    """How a worker works; `JobRunner(**settings)` builds one.

    concurrency: lanes, each with its own connection, running batches side by
        side: one runs handlers while another waits on the database, and
        async handlers that wait on I/O overlap.
    batch_size: most jobs one lane takes and commits at once. Larger batches
        amortise commits (the dominant cost of a no-op job); a batch is
        whatever is due, up to this size, so a lone job never waits to fill one.
    quick_batch: seconds. Jobs that run faster than this (at the lane's recent
        pace) go in quick batches, sized to last about this long: taken, run
        and recorded in one transaction, half the row writes; the jobs are
        not marked (the table says `pending`), and the surfaces show them
        running from the batch ledger (`ops/held.py`). Slower jobs are claimed one at a time and
        show `processing` with the worker's id while they run. 0: no quick
        batches; every batch (up to batch_size jobs) commits its claim first.
    savepoints: "auto": a job runs without a savepoint of its own until a job
        of its type fails after writing (that one failure rolls its batch back
        and reruns the jobs before it, each in a savepoint; from then on the
        type runs in savepoints). "always": every job that touches the
        database runs in a savepoint, so a failure never reruns batch-mates,
        at about a third more cost per writing job.
    shared: every worker works at once instead of one active and standbys.
    lease: seconds without a heartbeat after which a worker counts as hung
        and is fenced off; it bounds recovery from a stopped process.
    poll_interval: longest sleep between looks at the table when no
        notification arrives (scheduled jobs and retries are woken for on time).
    grace_period: seconds running handlers get to finish after SIGTERM.
    retry_policy: the backoff between a failed attempt and the next.
    burst: stop once nothing is due (tests, benchmarks, cron-style draining).
    keep_completed / keep_failed: seconds finished jobs are kept. The
        maintenance leader drops a day of history (UTC) once all of it is
        past retention: a job is kept that long, and less than a day more.
    archive_after: seconds a finished job stays in `jobs` before the
        maintenance leader moves it to the history (`jobqueue_history`,
        partitioned by day), where every read by id and every list still
        finds it. Short keeps `jobs` holding little but the unfinished.
    summary_interval: seconds between INFO lines that sum up what the worker
        did (counts, rate, latency percentiles); 0: none. Each job's own line
        is at DEBUG (a line per job would cost a fast worker half its speed);
        failures are WARNINGs, always.
    threads: sync (plain `def`) handlers running at once, each in a thread
        of the worker's pool with a database connection of its own (opened
        when first needed; none at all without sync handlers). Their jobs are
        claimed by a lane of their own, as many at a time as threads are free.
    queues: which queues to serve, and how. Empty (the default): every
        queue; the `concurrency` lanes take turns among the queues that have
        waiting jobs, a batch from each in turn, so a flood in one queue
        delays the others by a batch at most. Names only ("emails,reports",
        or a list): only those, shared by the `concurrency` lanes the same
        way. With lane counts ("emails=4,reports=1", or a mapping): that many
        lanes for each queue, serving it alone (a queue named without a count
        gets one), and `concurrency` is not used.
    """

    concurrency: int = DEFAULT_CONCURRENCY
    batch_size: int = DEFAULT_BATCH_SIZE
    quick_batch: float = 0.05
    savepoints: str = "auto"
    shared: bool = False
    lease: float = 5.0
    poll_interval: float = 1.0
    grace_period: float = 30.0
    retry_policy: RetryPolicy = field(default_factory=RetryPolicy)
    burst: bool = False
    keep_completed: float = DAY
    keep_failed: float = 7 * DAY
    archive_after: float = 60.0
    summary_interval: float = 10.0
    threads: int = DEFAULT_THREADS
    queues: tuple[tuple[str, int | None], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "queues", parse_queues(self.queues))
        if self.retry_policy is None:  # JobRunner(retry_policy=None): the default
            object.__setattr__(self, "retry_policy", RetryPolicy())
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.batch_size < 1:
            raise ValueError("batch size must be at least 1")
        if self.savepoints not in SAVEPOINT_MODES:
            raise ValueError(f"savepoints must be one of {', '.join(SAVEPOINT_MODES)}, "
                             f"not {self.savepoints!r}")
        if self.poll_interval <= 0:
            raise ValueError("poll interval must be positive")
        if self.grace_period < 0:
            raise ValueError("grace period must not be negative")
        if self.lease < 0.5:
            raise ValueError("lease must be at least 0.5 seconds")
        for name in ("quick_batch", "keep_completed", "keep_failed", "archive_after",
                     "summary_interval"):
            if not 0 <= getattr(self, name) < math.inf:
                raise ValueError(f"{name.replace('_', ' ')} must be a finite number of "
                                 "seconds, 0 or more")
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) \
                or self.threads < 1:
            raise ValueError(f"threads must be a whole number, 1 or more, not {self.threads!r}")

    @property
    def served(self) -> tuple[str, ...] | None:
        """The queues this worker takes jobs from (None: every queue)."""
        return tuple(name for name, _ in self.queues) or None

    @property
    def lane_queues(self) -> list[tuple[str, ...] | None]:
        """What each lane serves: a lane per entry (None: every queue)."""
        if any(lanes is not None for _, lanes in self.queues):
            return [(name,) for name, lanes in self.queues for _ in range(lanes or 1)]
        return [self.served] * self.concurrency

    @property
    def tick(self) -> float:
        """Seconds between heartbeats (and fencing checks): several per lease."""
        return min(0.5, self.lease / 4)

    @property
    def statement_timeout(self) -> float:
        """Seconds any statement on the upkeep connections may take: half the
        lease, so a statement stuck behind a lock (or a slow chore) gives up
        while this worker's heartbeat can still come in time."""
        return self.lease / 2


def parse_queues(spec: Any) -> tuple[tuple[str, int | None], ...]:
    """Queues to serve, from "emails=4,reports" (the CLI's form), a list of
    names, a mapping of name to lanes, or the parsed form itself; a
    ValueError that names the mistake otherwise."""
    if spec is None or spec == "":
        return ()
    items: list[tuple[Any, Any]]
    if isinstance(spec, str):
        items = []
        for part in spec.split(","):
            name, sep, lanes = part.strip().partition("=")
            if not name and not sep:
                raise ValueError(f"queues {spec!r}: an empty name (two commas in a row?)")
            items.append((name.strip(), _lanes(lanes.strip(), name) if sep else None))
    elif isinstance(spec, Mapping):
        items = list(spec.items())
    elif isinstance(spec, Sequence):
        items = [item if isinstance(item, tuple) else (item, None) for item in spec]
    else:
        raise ValueError(f"queues must be a string, a list or a mapping, not "
                         f"{type(spec).__name__}")
    seen: set[str] = set()
    parsed = []
    for name, lanes in items:
        check_queue(name)
        if name in seen:
            raise ValueError(f"queue {name!r} is named twice")
        seen.add(name)
        if lanes is not None and (isinstance(lanes, bool) or not isinstance(lanes, int)
                                  or lanes < 1):
            raise ValueError(f"queue {name!r}: lanes must be a whole number, 1 or more, "
                             f"not {lanes!r}")
        parsed.append((name, lanes))
    return tuple(parsed)


def _lanes(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"queue {name!r}: lanes must be a whole number, not {text!r}"
                         ) from None
