"""Prometheus metrics, read from the database at scrape time.

The process that serves `/metrics` is usually not the worker (the worker may
run elsewhere, or be a standby), so nothing is counted in memory: each scrape
runs a handful of queries (`queries.sql`: those of `routing.read`, `queue_settings`,
`workers`, `queue_health`, `horizon`, `metrics_finished`, `metrics_failed_attempts`) and
reports what the tables say. Figures about recent work cover a fixed window of the last
`WINDOW_SECONDS` (60 s), exported as `jobqueue_recent_window_seconds`.

Gauges:

- `jobqueue_jobs{status, queue, job_type}`: jobs in each state (every state
  of every queue and type present, zeros included). Unfinished jobs are
  counted; finished ones (`completed`, `failed`) too while there are up to
  `routing.EXACT_FINISHED` of them, and past that estimated from
  PostgreSQL's statistics (a finished status too rare in its sample to be
  told by queue and type shows with `queue=""`);
  `jobqueue_jobs_estimated{status}` is 1 for a status whose figures are
  estimates, 0 for one counted.

Every `job_type` label names one of the `MAX_JOB_TYPES` (100) types with
most jobs; the others are summed under `job_type="(other types)"`, so a
client that enqueues endless new types cannot make endless series.
- `jobqueue_queue_paused{queue}`: 1 for a paused queue, 0 otherwise (every
  queue with jobs or settings); `jobqueue_queue_concurrency_limit{queue}` and
  `jobqueue_queue_rate_limit_per_second{queue}`: a queue's limits, only for
  queues that have one (a rate per minute or hour is given per second).
- `jobqueue_unserved_jobs{queue, job_type}`: due waiting jobs that no live
  worker takes (none serves the queue with a handler for the type; see
  `jobqueue.ops.routing`), for every queue and type with due jobs, zeros
  included; `jobqueue_unserved_oldest_age_seconds{queue, job_type}`: how long
  the earliest of them has been due (0: none).
- `jobqueue_oldest_pending_age_seconds`: how long the longest-waiting due job
  (pending or retrying) has been due; 0 when none waits.
- `jobqueue_jobs_table_live_tuples`, `jobqueue_jobs_table_dead_tuples`,
  `jobqueue_jobs_table_last_autovacuum_timestamp_seconds` (0: never): the
  `jobs` table as `pg_stat_user_tables` sees it.
- `jobqueue_xmin_horizon_age_seconds`, `jobqueue_xmin_horizon_age_transactions`,
  `jobqueue_xmin_horizon_holder_info{kind, name, state}`: the oldest
  transaction (snapshot, prepared transaction, replication slot) holding back
  vacuum in this database, and who it is (`jobqueue.ops.horizon`): the cause
  when dead tuples grow.
- `jobqueue_workers{state}`: registered workers by state (standby, active,
  shared); `jobqueue_active_worker_info{worker_id, name}`: 1 for each worker
  that works (the active one, or all in shared mode);
  `jobqueue_worker_heartbeat_age_seconds{worker_id, name}`.
- `jobqueue_recent_window_seconds`: the window below (60).
- `jobqueue_completed_recent{job_type}`, `jobqueue_failed_recent{job_type}`:
  jobs that completed, or failed for good, in the window;
  `jobqueue_failed_attempts_recent{job_type}`: failed attempts (errors);
  `jobqueue_retries_recent{job_type}`: those scheduled again;
  `jobqueue_throughput_jobs_per_second`: finished jobs per second.

Gauge histograms (buckets 1 ms … 60 s), over jobs finished in the window:

- `jobqueue_wait_seconds{job_type}`: from due (enqueued, or `run_at`) to the
  start of the last attempt;
- `jobqueue_run_seconds{job_type}`: the last attempt's run time.

Use `render(conn)` from an async web handler (the HTTP API's `GET /metrics`
does), or `QueueCollector(await snapshot(conn))` in a registry of your own.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeHistogramMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from jobqueue.ops import horizon, routing
from jobqueue.ops.horizon import Holder
from jobqueue.ops.routing import Routing, Settings
from jobqueue.schema.models import STATUS_VALUES
from jobqueue.schema.queries import queries

__all__ = ["BUCKETS", "CONTENT_TYPE_LATEST", "WINDOW_SECONDS", "QueueCollector", "Snapshot",
           "exposition", "render", "snapshot"]

#: Recent figures (throughput, errors, latency histograms) cover this many seconds.
WINDOW_SECONDS = 60.0
#: Upper bounds (seconds) of the latency histograms' buckets; +Inf is added.
BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                              1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
WORKER_STATES = ("standby", "active", "shared")
#: Most job types named in labels: the API takes any job type, and each new
#: one would be a new series of every per-type family. Beyond these (the
#: ones with most jobs), the rest are summed under `OTHER_TYPES`.
MAX_JOB_TYPES = 100
OTHER_TYPES = "(other types)"


@dataclass
class Histogram:
    """Per-bucket counts (not cumulative) of values, with their sum."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))
    total: float = 0.0

    def add(self, bounds_at_or_above: int, n: int, total: float) -> None:
        # A value with k bounds at or above it falls in the bucket of bound
        # len - k (the last, +Inf, when k is 0).
        self.counts[len(BUCKETS) - bounds_at_or_above] += n
        self.total += total

    def merge(self, other: Histogram) -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.total += other.total

    def cumulative(self) -> list[tuple[str, float]]:
        out, seen = [], 0
        for bound, count in zip([*map(str, BUCKETS), "+Inf"], self.counts, strict=True):
            seen += count
            out.append((bound, float(seen)))
        return out


@dataclass
class Snapshot:
    """What one scrape read from the database."""

    routing: Routing = field(default_factory=Routing)
    oldest_pending_age: float = 0.0
    live_tuples: int = 0
    dead_tuples: int = 0
    last_autovacuum: float = 0.0
    horizon: Holder | None = None
    completed: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    failed: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    failed_attempts: dict[str, int] = field(default_factory=dict)
    retries: dict[str, int] = field(default_factory=dict)
    wait: dict[str, Histogram] = field(default_factory=lambda: defaultdict(Histogram))
    run: dict[str, Histogram] = field(default_factory=lambda: defaultdict(Histogram))
    window: float = WINDOW_SECONDS


async def snapshot(conn: AsyncConnection | AsyncSession, window: float = WINDOW_SECONDS,
                   routes: Routing | None = None) -> Snapshot:
    """Read everything the metrics report, in a handful of queries (one fewer with
    `routes`, a reading of `routing.read` made already)."""
    snap = Snapshot(window=window,
                    routing=await routing.read(conn) if routes is None else routes)
    health = (await conn.execute(queries["queue_health"].text)).one()
    snap.oldest_pending_age = snap.routing.oldest_due_age() or 0.0
    snap.live_tuples = int(health.live_tuples or 0)
    snap.dead_tuples = int(health.dead_tuples or 0)
    snap.last_autovacuum = float(health.last_autovacuum or 0)
    snap.horizon = await horizon.oldest(conn)

    neg_bounds = [-b for b in reversed(BUCKETS)]
    result = await conn.execute(queries["metrics_finished"].text,
                                {"window": window, "neg_bounds": neg_bounds})
    for row in result:
        counts = snap.completed if row.status == "completed" else snap.failed
        counts[row.job_type] += int(row.n)
        snap.wait[row.job_type].add(row.wait_above, int(row.n), float(row.wait_sum))
        snap.run[row.job_type].add(row.run_above, int(row.n), float(row.run_sum))

    for row in await conn.execute(queries["metrics_failed_attempts"].text, {"window": window}):
        snap.failed_attempts[row.job_type] = int(row.failed_attempts)
        snap.retries[row.job_type] = int(row.retries)
    return snap


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _by_type(name: str, doc: str, values: dict[str, int], types: list[str],
             label: Callable[[str], str]) -> Metric:
    family = GaugeMetricFamily(name, doc, labels=["job_type"])
    summed: dict[str, int] = defaultdict(int)
    for job_type, n in values.items():
        summed[label(job_type)] += n
    for job_type in types:
        family.add_metric([job_type], summed.get(job_type, 0))
    return family


def _labeller(snap: Snapshot) -> Callable[[str], str]:
    """A job type's label: itself among the `MAX_JOB_TYPES` with most jobs
    (waiting, running, finished, recent), else `OTHER_TYPES`."""
    weight: dict[str, int] = defaultdict(int)
    for g in snap.routing.groups:
        weight[g.job_type or OTHER_TYPES] += g.n
    for counts in (snap.completed, snap.failed, snap.failed_attempts):
        for job_type, n in counts.items():
            weight[job_type] += n
    if len(weight) <= MAX_JOB_TYPES:
        return lambda job_type: job_type
    named = set(sorted(weight, key=lambda t: (-weight[t], t))[:MAX_JOB_TYPES])
    return lambda job_type: job_type if job_type in named else OTHER_TYPES


class QueueCollector(Collector):
    """A prometheus_client collector that reports one `Snapshot`."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.label: Callable[[str], str] = _labeller(snap)

    def _horizon(self) -> Iterator[Metric]:
        h = self.snap.horizon
        yield _gauge("jobqueue_xmin_horizon_age_seconds",
                     "Seconds since the oldest transaction holding back vacuum in this "
                     "database began; 0 when none (or a replication slot, which keeps no time).",
                     0.0 if h is None or h.age_seconds is None else max(h.age_seconds, 0.0))
        yield _gauge("jobqueue_xmin_horizon_age_transactions",
                     "Transactions begun since the oldest snapshot holding back vacuum; 0: none.",
                     0 if h is None else h.xid_age)
        info = GaugeMetricFamily("jobqueue_xmin_horizon_holder_info",
                                 "1 for what holds back vacuum now: kind, application_name "
                                 "(or slot, prepared gid), state.",
                                 labels=["kind", "name", "state"])
        if h is not None:
            info.add_metric([h.kind, h.name, h.state or ""], 1)
        yield info

    def collect(self) -> Iterator[Metric]:
        s = self.snap
        groups = s.routing.groups
        label = self.label
        types = sorted({label(g.job_type or OTHER_TYPES) for g in groups} | {
            label(t) for t in (*s.completed, *s.failed, *s.failed_attempts)})

        jobs = GaugeMetricFamily("jobqueue_jobs", "Jobs in each state, by queue and type "
                                 "(estimates where jobqueue_jobs_estimated says so).",
                                 labels=["status", "queue", "job_type"])
        counts: dict[tuple[str, str, str], int] = defaultdict(int)
        for g in groups:
            counts[g.status, g.queue or "", label(g.job_type or OTHER_TYPES)] += g.n
        # Every state of every (queue, type) present, zeros included.
        for queue, job_type in sorted({(q, t) for _, q, t in counts}):
            for status in STATUS_VALUES:
                jobs.add_metric([status, queue, job_type],
                                counts.get((status, queue, job_type), 0))
        yield jobs
        estimated = GaugeMetricFamily("jobqueue_jobs_estimated",
                                      "1 for a status whose jobqueue_jobs figures are "
                                      "estimates from PostgreSQL's statistics, 0 if counted.",
                                      labels=["status"])
        for status in STATUS_VALUES:
            estimated.add_metric([status], int(status in s.routing.estimated))
        yield estimated
        yield from self._queues()

        yield _gauge("jobqueue_oldest_pending_age_seconds",
                     "Seconds the longest-waiting due job (pending or retrying) has been due; "
                     "0 when none is waiting.", s.oldest_pending_age)
        yield _gauge("jobqueue_jobs_table_live_tuples",
                     "Live rows of the jobs table (pg_stat_user_tables).", s.live_tuples)
        yield _gauge("jobqueue_jobs_table_dead_tuples",
                     "Dead rows of the jobs table awaiting vacuum (pg_stat_user_tables).",
                     s.dead_tuples)
        yield _gauge("jobqueue_jobs_table_last_autovacuum_timestamp_seconds",
                     "Unix time of the jobs table's last autovacuum; 0 if never.",
                     s.last_autovacuum)

        yield from self._horizon()
        yield from self._workers()

        yield _gauge("jobqueue_recent_window_seconds",
                     "The window the *_recent metrics and latency histograms cover.", s.window)
        yield _by_type("jobqueue_completed_recent",
                       "Jobs completed in the recent window.", s.completed, types, label)
        yield _by_type("jobqueue_failed_recent",
                       "Jobs that failed for good in the recent window.", s.failed, types,
                       label)
        yield _by_type("jobqueue_failed_attempts_recent",
                       "Failed attempts (errors) in the recent window.", s.failed_attempts, types,
                       label)
        yield _by_type("jobqueue_retries_recent",
                       "Failed attempts in the recent window that were scheduled again.",
                       s.retries, types, label)
        finished = sum(s.completed.values()) + sum(s.failed.values())
        yield _gauge("jobqueue_throughput_jobs_per_second",
                     "Jobs finished (completed or failed for good) per second over the "
                     "recent window.", finished / s.window if s.window else 0.0)

        for name, doc, hists in (
            ("jobqueue_wait_seconds",
             "From due (enqueue, or run_at) to the start of the last attempt, for jobs "
             "finished in the recent window.", s.wait),
            ("jobqueue_run_seconds",
             "Run time of the last attempt, for jobs finished in the recent window.", s.run),
        ):
            family = GaugeHistogramMetricFamily(name, doc, labels=["job_type"])
            merged: dict[str, Histogram] = defaultdict(Histogram)
            for job_type, h in hists.items():
                merged[label(job_type)].merge(h)
            for job_type in sorted(merged):
                h = merged[job_type]
                family.add_metric([job_type], h.cumulative(), gsum_value=h.total)
            yield family

    def _queues(self) -> Iterator[Metric]:
        paused = GaugeMetricFamily("jobqueue_queue_paused",
                                   "1 if the queue is paused (fleet-wide), else 0.",
                                   labels=["queue"])
        concurrency = GaugeMetricFamily(
            "jobqueue_queue_concurrency_limit",
            "Most jobs of the queue running at once, fleet-wide (queues with a limit only).",
            labels=["queue"])
        rate = GaugeMetricFamily(
            "jobqueue_queue_rate_limit_per_second",
            "Most jobs of the queue started per second, fleet-wide (queues with a rate "
            "limit only; a limit per minute or hour divided down).", labels=["queue"])
        settings = self.snap.routing.settings
        for queue in sorted({g.queue for g in self.snap.routing.groups if g.queue is not None}
                            | set(settings)):
            q = settings.get(queue, Settings())
            paused.add_metric([queue], 1 if q.paused else 0)
            if q.concurrency is not None:
                concurrency.add_metric([queue], q.concurrency)
            if q.rate is not None:
                rate.add_metric([queue], q.rate.limit / q.rate.period)
        yield paused
        yield concurrency
        yield rate

        unserved = GaugeMetricFamily(
            "jobqueue_unserved_jobs",
            "Due waiting jobs that no live worker takes (none serves the queue with a "
            "handler for the type), by queue and type; zeros included.",
            labels=["queue", "job_type"])
        oldest = GaugeMetricFamily(
            "jobqueue_unserved_oldest_age_seconds",
            "Seconds the earliest due job that no live worker takes has been due; 0: none.",
            labels=["queue", "job_type"])
        label = self.label
        found: dict[tuple[str, str], list[float]] = {}
        for u in self.snap.routing.unserved():
            count_age = found.setdefault((u["queue"], label(u["job_type"])), [0, 0.0])
            count_age[0] += u["count"]
            count_age[1] = max(count_age[1], u["oldest_due_age_seconds"])
        for key in sorted({(g.queue, label(g.job_type)) for g in self.snap.routing.groups
                           if g.due and g.queue is not None and g.job_type is not None}):
            count, age = found.get(key, [0, 0.0])
            unserved.add_metric(list(key), count)
            oldest.add_metric(list(key), age)
        yield unserved
        yield oldest

    def _workers(self) -> Iterator[Metric]:
        workers = self.snap.routing.workers
        states = GaugeMetricFamily("jobqueue_workers", "Registered workers, by state.",
                                   labels=["state"])
        for state in WORKER_STATES:
            states.add_metric([state], sum(w["state"] == state for w in workers))
        yield states
        info = GaugeMetricFamily("jobqueue_active_worker_info",
                                 "1 for each worker that is working (active, or shared mode).",
                                 labels=["worker_id", "name"])
        age = GaugeMetricFamily("jobqueue_worker_heartbeat_age_seconds",
                                "Seconds since each worker's last heartbeat.",
                                labels=["worker_id", "name"])
        for w in workers:
            labels = [str(w["id"]), w["name"]]
            if w["state"] in ("active", "shared"):
                info.add_metric(labels, 1)
            # The scrape's now() is its transaction's start: a heartbeat that
            # landed since would be a few ms in the future.
            age.add_metric(labels, max(float(w["heartbeat_age"]), 0.0))
        yield info
        yield age


async def render(conn: AsyncConnection | AsyncSession,
                 window: float = WINDOW_SECONDS) -> bytes:
    """The metrics in Prometheus' text format (`CONTENT_TYPE_LATEST`)."""
    return exposition(await snapshot(conn, window))


def exposition(snap: Snapshot) -> bytes:
    """A snapshot in Prometheus' text format (`CONTENT_TYPE_LATEST`)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(snap))
    return generate_latest(registry)
