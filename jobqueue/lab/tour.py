"""Lesson 07's helpers: a tour of jobqueue as its users meet it.

The lesson enqueues jobs inside transactions, runs handlers with a worker in
the notebook, watches retries back off, reads the metrics, and kills a real
worker process to watch a standby take over. What the notebook shows must be
checkable, so every helper here returns labels, counts and booleans for the
checked cells, and keeps ids, times and PIDs for the plots and the cells whose
output is not compared.

The lab's handlers live here (notebook cells define no functions):

- `flaky` fails on its first attempts, then succeeds: a service back after a blip;
- `broken` always fails: a job no retry can save;
- `verbose` fails with a 5,000-character message: `error_message` keeps 2,000;
- `gated` waits until the notebook opens a gate: a job caught in `processing`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import asyncpg
from sqlalchemy.ext.asyncio import AsyncSession

from jobqueue import current_job
from jobqueue.lab import (
    examples,  # noqa: F401 - registers the three example handlers
    slow_jobs,  # noqa: F401 - registers slow_write, for the worker processes
)
from jobqueue.registry import HandlerRegistry, handlers
from jobqueue.retry import RetryPolicy
from jobqueue.schema.locks import ACTIVE_KEY, LOCK_CLASS
from jobqueue.testing import WorkerProcess, wait_for

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

#: The example handlers of `jobqueue.lab.examples`, by job type.
EXAMPLE_TYPES = ("send_email", "generate_report", "process_payment")
#: The job of `jobqueue.lab.slow_jobs`, which the lesson's worker processes run.
SLOW_TYPES = ("slow_write",)
#: States in which a job will not run again.
FINISHED = ("completed", "failed")

def quiet_worker_logs(level: int = logging.ERROR) -> None:
    """Keep the worker's own log lines (a WARNING per failed attempt) out of
    the notebook: a worker running in the background would print them into
    whichever cell runs at that moment. The database keeps the same story
    (`error_history`), and that is what the lesson reads."""
    logging.getLogger("jobqueue").setLevel(level)


# -- the lab's handlers -------------------------------------------------------------

lab_handlers = HandlerRegistry()


class UpstreamError(Exception):
    """What `flaky` raises: a transient failure of some service it calls."""


@lab_handlers.register("flaky")
async def flaky(session: AsyncSession, payload: dict[str, Any]) -> dict[str, Any]:
    """Fail on the first `fail_times` attempts, then succeed.

    The attempt number comes from `current_job()`, not from a counter in
    memory, so the failures are the same in every run and in every process.
    """
    attempt = current_job().attempt
    if attempt <= int(payload.get("fail_times", 2)):
        raise UpstreamError(f"service unavailable on attempt {attempt}")
    return {"succeeded_on_attempt": attempt}


@lab_handlers.register("broken")
async def broken(session: AsyncSession, payload: dict[str, Any]) -> None:
    """Always fail: bad input that no retry will fix."""
    raise ValueError(f"invoice {payload.get('invoice')!r} is malformed")


#: What `verbose` raises: an HTML error page pasted into an exception.
VERBOSE_ERROR = "upstream answered: " + "<div>oops</div>" * 333


@lab_handlers.register("verbose")
async def verbose(session: AsyncSession, payload: dict[str, Any]) -> None:
    """Fail with a message far longer than `error_message` keeps."""
    raise RuntimeError(VERBOSE_ERROR)


_gate = asyncio.Event()


def close_gate() -> None:
    """From now on `gated` jobs wait in their handler until `open_gate()`."""
    _gate.clear()


def open_gate() -> None:
    """Let waiting `gated` jobs finish."""
    _gate.set()


@lab_handlers.register("gated")
async def gated(session: AsyncSession, payload: dict[str, Any]) -> dict[str, Any]:
    """Wait for the notebook's gate (at most 30 s), so the job can be seen
    while it is `processing`. Only for a worker in the notebook's own process."""
    await asyncio.wait_for(_gate.wait(), 30)
    return {"gate": "opened"}


def lesson_registry() -> HandlerRegistry:
    """A registry of the three examples of `jobqueue.lab.examples`, the
    `slow_write` of the worker processes and the lab's handlers. A registry of
    its own, not the global `handlers`, so what this notebook's workers can
    run is exactly what it lists."""
    registry = HandlerRegistry()
    for job_type in EXAMPLE_TYPES + SLOW_TYPES:
        handler = handlers.get(job_type)
        assert handler is not None, f"jobqueue.lab.examples registers {job_type}"
        registry.add(job_type, handler)
    for job_type in lab_handlers:
        handler = lab_handlers.get(job_type)
        assert handler is not None
        registry.add(job_type, handler)
    return registry


# -- looking at the jobs table ---------------------------------------------------------


async def count_jobs(conn: asyncpg.Connection, job_type: str | None = None) -> int:
    """Jobs this connection can see (committed ones, from another connection)."""
    return int(await conn.fetchval(
        "SELECT count(*) FROM jobqueue_all_jobs WHERE $1::text IS NULL OR job_type = $1", job_type))


async def listen(conn: asyncpg.Connection, channel: str = "jobqueue") -> list[str]:
    """LISTEN on `channel`; the returned list grows by one payload per
    notification delivered (the wake-up call the jobs table's trigger sends)."""
    heard: list[str] = []
    await conn.add_listener(channel, lambda _c, _pid, _channel, payload: heard.append(payload))
    return heard


async def heard_count(heard: list[str], at_least: int, timeout: float = 5.0) -> int:
    """How many notifications arrived, once at least `at_least` have (they
    come asynchronously, a moment after the commit)."""
    await wait_for(lambda: len(heard) >= at_least, timeout=timeout,
                   message=f"{at_least} notification(s)")
    return len(heard)


async def status_counts(conn: asyncpg.Connection, job_type: str | None = None
                        ) -> dict[str, int]:
    """{status: count}, for the statuses present, in the state machine's order."""
    rows = await conn.fetch(
        "SELECT status, count(*) AS n FROM jobqueue_all_jobs "
        "WHERE $1::text IS NULL OR job_type = $1 GROUP BY status", job_type)
    found = {r["status"]: int(r["n"]) for r in rows}
    order = ("pending", "processing", "retrying", "completed", "failed")
    return {s: found[s] for s in order if s in found}


def short_error(message: str | None, width: int = 70) -> str | None:
    """An error message cut for a table, on one line. SQLAlchemy wraps the
    driver's error in its own (`IntegrityError: (…asyncpg.UniqueViolationError)
    duplicate key…`): keep the driver's class name and PostgreSQL's message."""
    if message is None:
        return None
    text = message.splitlines()[0]
    text = re.sub(r"^\w+: \((?:[\w]+\.)*(\w+)\) ", r"\1: ", text)
    return text if len(text) <= width else text[: width - 1] + "…"


async def jobs_table(conn: asyncpg.Connection, jobs: Mapping[str, uuid.UUID] | None = None,
                     *, job_type: str | None = None) -> pd.DataFrame:
    """The columns that tell a job's story, without ids or times.

    jobs: {label: id} to show those jobs under their labels; otherwise every
    job (of `job_type`), in the order they were created.
    """
    import pandas as pd

    sql = ("SELECT id, job_type, payload::text AS payload, status, retry_count, max_retries, "
           "jsonb_array_length(error_history) AS history, error_message, result::text AS result "
           "FROM jobqueue_all_jobs WHERE ($1::uuid[] IS NULL OR id = ANY($1)) "
           "AND ($2::text IS NULL OR job_type = $2) ORDER BY created_at, id")
    ids = list(jobs.values()) if jobs is not None else None
    rows = {r["id"]: r for r in await conn.fetch(sql, ids, job_type)}
    order = ids if ids is not None else list(rows)
    labels = {v: k for k, v in jobs.items()} if jobs is not None else {}
    out = []
    for job_id in order:
        r = rows[job_id]
        entry: dict[str, Any] = {"job": labels[job_id]} if labels else {}
        entry.update({"job_type": r["job_type"], "payload": r["payload"], "status": r["status"],
                      "retry_count": r["retry_count"], "max_retries": r["max_retries"],
                      "history": r["history"], "error": short_error(r["error_message"]) or "",
                      "result": r["result"] or ""})
        out.append(entry)
    return pd.DataFrame(out)


async def wait_finished(conn: asyncpg.Connection, ids: Iterable[uuid.UUID],
                        timeout: float = 20.0) -> None:
    """Until every job in `ids` is completed or failed (never a fixed sleep)."""
    wanted = list(ids)

    async def finished() -> bool:
        n = await conn.fetchval(
            "SELECT count(*) FROM jobqueue_all_jobs WHERE id = ANY($1) AND status = ANY($2)",
            wanted, list(FINISHED))
        return bool(n == len(wanted))

    await wait_for(finished, timeout=timeout, message="every job finished")


async def wait_status(conn: asyncpg.Connection, job_id: uuid.UUID, status: str,
                      timeout: float = 20.0) -> str:
    """Until job `job_id` has `status`; returns it."""

    async def reached() -> str | None:
        now = await conn.fetchval("SELECT status FROM jobqueue_all_jobs WHERE id = $1", job_id)
        return now if now == status else None

    return str(await wait_for(reached, timeout=timeout, message=f"status {status}"))


async def outcome(conn: asyncpg.Connection, job_id: uuid.UUID) -> dict[str, Any]:
    """How a job ended: its status, retry_count, and how many times its
    handler ran (every failed run left an entry in `error_history`)."""
    row = await conn.fetchrow(
        "SELECT status, retry_count, jsonb_array_length(error_history) "
        "+ CASE WHEN status = 'completed' THEN 1 ELSE 0 END AS runs "
        "FROM jobqueue_all_jobs WHERE id = $1",
        job_id)
    return {"runs": row["runs"], "retry_count": row["retry_count"], "status": row["status"]}


async def retry_scheduled_after(conn: asyncpg.Connection, job_id: uuid.UUID) -> float:
    """Seconds between a retrying job's last failure and its next attempt:
    `next_retry_at` minus the time of the last entry of `error_history`, both
    written by the same statement, so this is exactly the backoff chosen."""
    return float(await conn.fetchval(
        "SELECT extract(epoch FROM next_retry_at "
        "- CAST(error_history -> -1 ->> 'at' AS timestamptz)) FROM jobqueue_all_jobs WHERE id = $1",
        job_id))


async def error_lengths(conn: asyncpg.Connection, job_id: uuid.UUID) -> dict[str, int]:
    """How long the stored errors are: `error_message` and each history entry."""
    row = await conn.fetchrow(
        "SELECT length(error_message) AS message, "
        "ARRAY(SELECT length(e ->> 'error') FROM jsonb_array_elements(error_history) AS e) "
        "AS history FROM jobqueue_all_jobs WHERE id = $1", job_id)
    return {"error_message": row["message"],
            **{f"history[{i}]": n for i, n in enumerate(row["history"])}}


# -- retries as a timeline -------------------------------------------------------------


async def attempt_timeline(conn: asyncpg.Connection, jobs: Mapping[str, uuid.UUID],
                           policy: RetryPolicy) -> pd.DataFrame:
    """Every attempt of `jobs`, in time, from the database alone.

    Failed attempts come from `error_history` (attempt number, ISO 8601 time of
    the statement that recorded it); a success from `completed_at`. `gap` is
    the time since the job's previous attempt was recorded, `backoff` what the
    policy scheduled between them (`policy` must be the worker's, jitter 0).
    `seconds` counts from the first attempt shown.
    """
    import pandas as pd

    rows: list[dict[str, Any]] = []
    for label, job_id in jobs.items():
        rec = await conn.fetchrow(
            "SELECT status, error_history::text AS history, completed_at FROM jobqueue_all_jobs "
            "WHERE id = $1", job_id)
        attempts = [(e["attempt"], "failed", datetime.fromisoformat(e["at"]), e["error"])
                    for e in json.loads(rec["history"])]
        if rec["status"] == "completed":
            attempts.append((len(attempts) + 1, "completed", rec["completed_at"], None))
        previous: datetime | None = None
        for attempt, outcome, at, error in attempts:
            rows.append({
                "job": label, "attempt": attempt, "outcome": outcome, "at": at, "error": error,
                "gap": None if previous is None else (at - previous).total_seconds(),
                "backoff": None if previous is None else policy.delay(attempt - 1),
            })
            previous = at
    table = pd.DataFrame(rows)
    start = table["at"].min()
    table.insert(4, "seconds", [(t - start).total_seconds() for t in table["at"]])
    return table


def backoff_respected(timeline: pd.DataFrame) -> bool:
    """True when every retry came no sooner than its backoff (database clock)."""
    retries = timeline.dropna(subset=["gap"])
    return bool(len(retries)) and bool((retries["gap"] >= retries["backoff"]).all())


def plot_timeline(timeline: pd.DataFrame) -> Figure:
    """Attempts over time, one row per job: crosses for failures, a dot for
    the success, each wait labelled with what it was and what it had to be."""
    import matplotlib.pyplot as plt
    import pandas as pd

    labels = list(dict.fromkeys(timeline["job"]))
    fig, ax = plt.subplots(figsize=(9, 1.0 + 1.1 * len(labels)))
    for y, label in enumerate(labels):
        rows = timeline[timeline["job"] == label].sort_values("attempt")
        ax.plot(rows["seconds"], [y] * len(rows), color="0.75", zorder=1)
        for _, r in rows.iterrows():
            failed = r["outcome"] == "failed"
            ax.scatter(r["seconds"], y, marker="x" if failed else "o", s=90, zorder=3,
                       color="tab:red" if failed else "tab:green")
            ax.annotate(f"#{r['attempt']}", (r["seconds"], y), xytext=(0, -16),
                        textcoords="offset points", ha="center", fontsize=8)
            if pd.notna(r["gap"]):
                middle = r["seconds"] - r["gap"] / 2
                ax.annotate(f"{r['gap']:.2f} s\n(backoff {r['backoff']:.1f} s)", (middle, y),
                            xytext=(0, 9), textcoords="offset points", ha="center",
                            fontsize=8, color="tab:blue")
    ax.set_yticks(range(len(labels)), labels)
    ax.set_ylim(-0.7, len(labels) - 0.3)
    ax.set_xlabel("seconds since the first attempt (database clock)")
    ax.set_title("Attempts: × failed, ● completed; waits between attempts in blue")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


# -- the state machine -------------------------------------------------------------

class Transition(NamedTuple):
    """One way a job's status changes: from, to, when; `quick`: in a quick
    batch (taken, run and recorded in one transaction, never `processing`)."""

    src: str
    dst: str
    why: str
    quick: bool = False


#: Every transition a job can make, as the worker's statements make them
#: (`claim`, `complete`, `fail`, `hand_back`, `rescue`, and `take` for quick batches).
TRANSITIONS = (
    Transition("pending", "processing", "claimed (SKIP LOCKED),\ncommitted"),
    Transition("processing", "completed", "handler returned"),
    Transition("processing", "retrying", "raised,\nretries left"),
    Transition("retrying", "processing", "backoff over,\nclaimed"),
    Transition("processing", "failed", "raised, no retries left"),
    Transition("processing", "pending", "worker died or stopped:\nrescued / handed back"),
    Transition("pending", "completed", "quick batch: taken, returned,\none transaction", True),
    Transition("pending", "failed", "quick batch: raised,\nno retries left", True),
    Transition("pending", "retrying", "quick batch:\nraised, retries left", True),
    Transition("retrying", "completed", "quick batch (backoff over)", True),
    Transition("retrying", "failed", "quick batch:\nno retries left", True),
    Transition("retrying", "retrying", "quick batch:\nraised again", True),
)

#: Where each status sits in the diagram.
_WHERE = {"pending": (0.0, 1.0), "processing": (3.0, 1.0), "completed": (6.4, 2.1),
          "failed": (6.4, -0.1), "retrying": (3.0, -1.3)}
#: How much each arrow bends, and where its label sits (from the middle of the arrow).
_BENDS = {("retrying", "processing"): -0.35, ("processing", "retrying"): -0.35,
          ("processing", "pending"): -0.35, ("pending", "processing"): -0.2,
          ("pending", "completed"): -0.45, ("pending", "failed"): 0.0,
          ("pending", "retrying"): 0.3, ("retrying", "completed"): 0.35,
          ("retrying", "failed"): 0.15}
LABEL_OFFSETS = {("pending", "processing"): (0.0, 0.45), ("processing", "pending"): (-0.1, -0.62),
                 ("processing", "retrying"): (0.75, 0.0), ("retrying", "processing"): (-0.75, 0.0),
                 ("processing", "completed"): (-0.2, 0.25), ("processing", "failed"): (0.1, 0.3),
                 ("pending", "completed"): (0.0, 1.1), ("pending", "failed"): (1.9, -0.78),
                 ("pending", "retrying"): (-0.75, -0.5), ("retrying", "completed"): (1.45, 0.2),
                 ("retrying", "failed"): (0.2, -0.45)}


def plot_state_machine() -> Figure:
    """The five statuses and every transition between them (`TRANSITIONS`):
    solid arrows for claimed jobs, dashed for a claimed job going back,
    blue dotted ones for quick batches."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch

    colors = {"pending": "#dde6f5", "processing": "#fde9c8", "completed": "#d6f0d6",
              "failed": "#f6d2d2", "retrying": "#ece0f5"}
    fig, ax = plt.subplots(figsize=(10, 5.2))
    for name, (x, y) in _WHERE.items():
        ax.text(x, y, name, ha="center", va="center", fontsize=11, zorder=3,
                bbox={"boxstyle": "round,pad=0.5", "fc": colors[name], "ec": "0.4"})
    for t in TRANSITIONS:
        (x1, y1), (x2, y2) = _WHERE[t.src], _WHERE[t.dst]
        color = "tab:blue" if t.quick else "0.3"
        style = ":" if t.quick else ("--" if t.dst == "pending" else "-")
        if t.src == t.dst:  # a quick batch's retry that fails again: a loop under the box
            ax.add_patch(FancyArrowPatch((x1 + 0.3, y1 - 0.22), (x1 - 0.3, y1 - 0.22),
                                         connectionstyle="arc3,rad=-1.2", arrowstyle="-|>",
                                         mutation_scale=12, color=color, linestyle=style))
            ax.text(x1 - 1.0, y1 - 0.55, t.why, ha="center", va="center", fontsize=8,
                    color=color)
            continue
        ax.annotate("", xy=(x2, y2), xytext=(x1, y1),
                    arrowprops={"arrowstyle": "-|>", "color": color, "shrinkA": 26,
                                "shrinkB": 26, "linestyle": style,
                                "connectionstyle": f"arc3,rad={_BENDS.get((t.src, t.dst), 0.0)}"})
        if t.why:
            dx, dy = LABEL_OFFSETS.get((t.src, t.dst), (0, 0.2))
            ax.text((x1 + x2) / 2 + dx, (y1 + y2) / 2 + dy, t.why, ha="center", va="center",
                    fontsize=8, color="tab:blue" if t.quick else "0.25")
    ax.text(6.4, -1.9, "blue, dotted: quick batches (taken, run\nand recorded in one "
            "transaction:\nnever processing)", ha="center", va="center", fontsize=8,
            color="tab:blue")
    ax.set_xlim(-0.8, 7.6)
    ax.set_ylim(-2.4, 3.7)
    ax.axis("off")
    fig.tight_layout()
    return fig


# -- the worker's report and `jobqueue status` ---------------------------------------------

#: Figures of `JobRunner.run()`'s report that are counts (same in every run).
#: Not `handed_back`: jobs a quick batch did not reach before its time ran
#: out go back to the queue, and how many depends on the machine's load.
REPORT_COUNTS = ("processed", "failed", "retried", "rescued", "error_rate")


def report_counts(report: Mapping[str, Any]) -> dict[str, Any]:
    """The report's counts: what became of the jobs, the same in every run."""
    return {k: report[k] for k in REPORT_COUNTS}


def report_timings(report: Mapping[str, Any]) -> dict[str, Any]:
    """The report's timings: how fast it went this time."""
    return {k: report[k] for k in ("elapsed_seconds", "batches", "throughput_per_sec",
                                   "handler_ms", "latency_ms")}


def summary_counts(summary: Mapping[str, Any]) -> dict[str, Any]:
    """What `queue_summary` says that does not depend on timing."""
    recent = summary["recent"]
    return {"counts": summary["counts"], "total": summary["total"],
            "recent completed": recent["completed"], "recent failed": recent["failed"],
            "recent failed attempts": recent["failed_attempts"],
            "error_rate": recent["error_rate"], "workers": len(summary["workers"])}


def summary_timings(summary: Mapping[str, Any]) -> dict[str, Any]:
    recent = summary["recent"]
    return {"throughput_per_sec": recent["throughput_per_sec"],
            "latency_ms": recent["latency_ms"], "run_time_ms": recent["run_time_ms"]}


# -- real worker processes, by label ---------------------------------------------------

#: The lesson's worker processes: the `slow_write` job, small batches, quiet
#: (WARNING and above: a rescue, a fencing).
WORKER_ARGS = ("--import", "jobqueue.lab.slow_jobs", "--batch-size", "10",
               "--log-level", "WARNING")
#: No quick batches: every batch is claimed (committed as `processing`) before
#: it runs, so a worker that dies leaves jobs for a standby to put back.
CLAIM_FIRST = ("--quick-batch", "0")
#: What a worker logs when it puts back jobs of dead workers (`worker/runner.py`, `upkeep.py`).
RESCUE_LINE = re.compile(r"returned (\d+) job\(s\) of dead workers to the queue")


@dataclass
class Crew:
    """Real `jobqueue worker` processes, called by labels ("first", "second")
    instead of PIDs and worker ids, so that what the lesson prints is the same
    in every run. `close()` ends them all; call it even when all went well."""

    url: str
    log_dir: Path
    processes: dict[str, WorkerProcess] = field(default_factory=dict)
    #: Worker ids seen so far (a worker takes a new id when it starts over).
    labels: dict[int, str] = field(default_factory=dict)

    def start(self, label: str, *extra: str) -> WorkerProcess:
        """Start `jobqueue worker` with `WORKER_ARGS` (and `extra`) as `label`."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        process = WorkerProcess(self.url, self.log_dir / f"{label}.log", *WORKER_ARGS, *extra)
        self.processes[label] = process
        return process

    def label_of(self, name: str) -> str | None:
        """The label of a worker by its `host:pid` name."""
        pid = name.rsplit(":", 1)[-1]
        for label, process in self.processes.items():
            if str(process.pid) == pid:
                return label
        return None

    async def workers(self, conn: asyncpg.Connection) -> list[dict[str, str]]:
        """Rows of `jobqueue_workers` as [{worker, mode, state}], oldest first."""
        rows = await conn.fetch(
            "SELECT id, name, mode, state FROM jobqueue_workers ORDER BY started_at, name")
        out = []
        for r in rows:
            label = self.label_of(r["name"]) or "other"
            self.labels[r["id"]] = label
            out.append({"worker": label, "mode": r["mode"], "state": r["state"]})
        return out

    async def table(self, conn: asyncpg.Connection) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(await self.workers(conn))

    async def wait_states(self, conn: asyncpg.Connection, states: Mapping[str, str],
                          timeout: float = 30.0) -> None:
        """Until `jobqueue_workers` holds exactly these {label: state} rows.

        A worker registers as `standby` a moment before it calls
        `pg_advisory_lock`; a standby counts here once PostgreSQL shows it
        waiting for the lock, so what the next cell sees is settled."""

        async def reached() -> bool:
            now = {w["worker"]: w["state"] for w in await self.workers(conn)}
            if now != dict(states):
                return False
            waiting = (await self.active_lock(conn))["waits"]
            return all(label in waiting for label, state in states.items()
                       if state == "standby")

        await wait_for(reached, timeout=timeout, message=f"workers {dict(states)}")

    async def active_lock(self, conn: asyncpg.Connection) -> dict[str, list[str]]:
        """PostgreSQL's own view of the active worker's advisory lock: who
        holds it and who waits for it (`pg_locks` joined to the backends'
        application names, which carry the worker id)."""
        rows = await conn.fetch(
            "SELECT l.granted, a.application_name FROM pg_locks AS l "
            "JOIN pg_stat_activity AS a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.classid = $1 AND l.objid = $2 "
            "AND l.objsubid = 2 AND l.database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())",
            LOCK_CLASS, ACTIVE_KEY)
        await self.workers(conn)  # learn ids of new lives
        out: dict[str, list[str]] = {"holds": [], "waits": []}
        for r in rows:
            match = re.match(r"jobqueue worker (\d+) ", r["application_name"] or "")
            label = self.labels.get(int(match.group(1)), "other") if match else "other"
            out["holds" if r["granted"] else "waits"].append(label)
        return {k: sorted(v) for k, v in out.items()}

    async def signal(self, conn: asyncpg.Connection, label: str, sig: signal.Signals
                     ) -> datetime:
        """Send `sig` to worker `label`; the database's clock right after,
        the instant recovery times are measured from."""
        await self.workers(conn)  # remember its id before it may vanish
        os.kill(self.processes[label].pid, sig)
        at: datetime = await conn.fetchval("SELECT clock_timestamp()")
        return at

    def ids_of(self, label: str) -> list[int]:
        """Every worker id seen for `label` (one per life)."""
        return [worker_id for worker_id, seen in self.labels.items() if seen == label]

    async def settled(self, conn: asyncpg.Connection, label: str) -> bool:
        """True when no backend of worker `label` is running a statement: what
        a stopped process sent has been done, so its rows hold still."""
        await self.workers(conn)
        busy = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
            "AND datname = current_database() "
            "AND substring(application_name FROM '^jobqueue worker (\\d+) ')::bigint = ANY($1)",
            self.ids_of(label))
        return busy == 0

    async def freeze_holding(self, conn: asyncpg.Connection, label: str,
                             holding: Callable[[], Awaitable[list[uuid.UUID]]],
                             progress: Callable[[], Awaitable[int]],
                             timeout: float = 30.0) -> tuple[list[uuid.UUID], datetime]:
        """Freeze worker `label` (SIGSTOP) at an instant when `holding()`
        finds jobs, and say which, with the database's clock at the freeze.

        Frozen, the process sends nothing; once its backends have finished
        what it had sent (`settled`), what it holds cannot change. A freeze
        that caught it between two batches, holding nothing, is undone
        (SIGCONT) and tried again after `progress()` (say, completed jobs)
        has moved on. The process stays frozen: kill it, or leave it hung."""
        process = self.processes[label]
        await self.workers(conn)
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            process.signal(signal.SIGSTOP)
            at: datetime = await conn.fetchval("SELECT clock_timestamp()")
            await wait_for(lambda: self.settled(conn, label), timeout=timeout,
                           message=f"{label}'s backends idle")
            held = await holding()
            if held:
                return held, at
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise TimeoutError(f"{label} never caught holding jobs within {timeout:g}s")
            before = await progress()
            process.signal(signal.SIGCONT)

            async def moved_on(before: int = before) -> bool:
                return await progress() > before

            await wait_for(moved_on, timeout=left, message=f"{label} working again")

    def rescued_in_log(self, label: str) -> int:
        """Jobs of dead workers that `label` says it put back (every such line summed)."""
        return sum(int(m.group(1)) for line in self.log_lines(label)
                   if (m := RESCUE_LINE.search(line)))

    async def wait_rescued(self, label: str, at_least: int, timeout: float = 30.0) -> int:
        """Until `label` has logged putting back `at_least` jobs; how many it logged."""
        return int(await wait_for(
            lambda: (n := self.rescued_in_log(label)) >= at_least and n,
            timeout=timeout, message=f"{label} logging {at_least} rescued job(s)"))

    async def stop(self, label: str, timeout: float = 30.0) -> None:
        """SIGTERM worker `label` and wait until it has exited."""
        await self.processes[label].stop(timeout)

    def log_lines(self, label: str, contains: str = "") -> list[str]:
        """Lines of the worker's log (WARNING and above) that contain `contains`."""
        return [line for line in self.processes[label].log().splitlines() if contains in line]

    def close(self) -> dict[str, str]:
        """End every process (SIGCONT, then SIGKILL, if still running): how each ended."""
        ended = {}
        for label, process in self.processes.items():
            running = process.proc.poll() is None
            process.close()
            code = process.proc.returncode
            ended[label] = "killed now" if running else f"had exited ({code})"
        return ended


async def completions(conn: asyncpg.Connection, crew: Crew, since: datetime,
                      ids: Sequence[uuid.UUID]) -> pd.DataFrame:
    """The completed jobs among `ids`: which worker (label) completed each,
    and when, in seconds relative to `since` (database clock; negative: before)."""
    import pandas as pd

    await crew.workers(conn)
    rows = await conn.fetch(
        "SELECT worker_id, extract(epoch FROM completed_at - $1::timestamptz) AS seconds "
        "FROM jobqueue_all_jobs WHERE id = ANY($2) AND status = 'completed' ORDER BY completed_at",
        since, list(ids))
    return pd.DataFrame([{"worker": crew.labels.get(r["worker_id"], "other"),
                          "seconds": float(r["seconds"])} for r in rows],
                        columns=["worker", "seconds"])


def completed_by(done: pd.DataFrame) -> dict[str, int]:
    """Jobs completed per worker label."""
    return {str(k): int(v) for k, v in done.groupby("worker").size().items()}


def completed_after(done: pd.DataFrame, worker: str) -> int:
    """Jobs `worker` completed after the signal (second 0)."""
    return int(((done["worker"] == worker) & (done["seconds"] > 0)).sum())


def recovery_seconds(done: pd.DataFrame, successor: str) -> float:
    """From the signal (second 0) to the successor's first completion after it."""
    after = done[(done["worker"] == successor) & (done["seconds"] > 0)]
    return float(after["seconds"].min())


def plot_completions(done: pd.DataFrame, successor: str, event: str = "SIGKILL",
                     bin_seconds: float = 0.1) -> Figure:
    """Two views of the same completions around a signal (second 0): jobs
    completed per `bin_seconds` stacked by worker, and the running total per
    worker, where the stretch without progress is the recovery time."""
    import matplotlib.pyplot as plt
    import numpy as np

    palette = {"first": "tab:blue", "second": "tab:orange", "third": "tab:green"}
    low = np.floor(done["seconds"].min() / bin_seconds) * bin_seconds
    high = np.ceil(done["seconds"].max() / bin_seconds) * bin_seconds + bin_seconds
    edges = np.arange(low, high + bin_seconds / 2, bin_seconds)
    fig, (bars, total) = plt.subplots(2, 1, figsize=(9, 5.2), sharex=True,
                                      gridspec_kw={"height_ratios": [1, 1.2]})
    bottom = np.zeros(len(edges) - 1)
    workers = list(dict.fromkeys(done["worker"]))
    for label in workers:
        counts, _ = np.histogram(done.loc[done["worker"] == label, "seconds"], bins=edges)
        bars.bar(edges[:-1], counts, width=bin_seconds, align="edge", bottom=bottom,
                 label=label, color=palette.get(label), edgecolor="white", linewidth=0.5)
        bottom += counts
    bars.set_ylabel(f"jobs per {bin_seconds * 1000:.0f} ms")
    bars.legend(title="completed by", loc="upper right")
    ordered = done.sort_values("seconds")
    for label in workers:
        mine = ordered["worker"] == label
        total.step(ordered["seconds"][mine], np.cumsum(mine)[mine], where="post",
                   color=palette.get(label), label=label)
    recovery = recovery_seconds(done, successor)
    total.axvspan(0, recovery, color="tab:red", alpha=0.15)
    total.annotate(f"no job completed for {recovery * 1000:.0f} ms",
                   (recovery, 0.85), xycoords=("data", "axes fraction"), xytext=(6, 0),
                   textcoords="offset points", color="tab:red")
    total.set_ylabel("jobs completed so far")
    total.set_xlabel(f"seconds since {event} (database clock)")
    for ax in (bars, total):
        ax.axvline(0, color="tab:red", linestyle="--", linewidth=1)
        ax.grid(axis="x", alpha=0.3)
    bars.annotate(event, (0, 1), xycoords=("data", "axes fraction"), xytext=(4, -14),
                  textcoords="offset points", color="tab:red")
    fig.tight_layout()
    return fig


async def held_by(conn: asyncpg.Connection, crew: Crew, label: str) -> list[uuid.UUID]:
    """Jobs `processing` under any worker id of `label`: what it had claimed."""
    await crew.workers(conn)
    rows = await conn.fetch(
        "SELECT id FROM jobs WHERE status = 'processing' AND worker_id = ANY($1) ORDER BY id",
        crew.ids_of(label))
    return [r["id"] for r in rows]


async def locked_waiting(conn: asyncpg.Connection, ids: Sequence[uuid.UUID]
                         ) -> list[uuid.UUID]:
    """Jobs of `ids` still waiting (`pending`, `retrying`) that some open
    transaction holds locked: what a quick batch has taken. Found the way
    workers pass each other: the rows `FOR UPDATE SKIP LOCKED` skips (the
    probe's own locks end with its statement)."""
    rows = await conn.fetch(
        "WITH free AS (SELECT id FROM jobs WHERE id = ANY($1) "
        "              AND status IN ('pending', 'retrying') FOR UPDATE SKIP LOCKED) "
        "SELECT id FROM jobs WHERE id = ANY($1) AND status IN ('pending', 'retrying') "
        "AND id NOT IN (SELECT id FROM free) ORDER BY id", list(ids))
    return [r["id"] for r in rows]


async def written_down(conn: asyncpg.Connection, ids: Sequence[uuid.UUID]
                       ) -> list[uuid.UUID]:
    """Jobs of `ids` that a quick batch holds locked and has already written
    down in the ledger (`jobqueue_batches`, under a transaction still in
    progress): what a rescue finds of the batch if its worker dies now. A
    lane caught between its `take` and its ledger write holds jobs that no
    row names yet; killed there, it leaves nothing for the rescue to mark."""
    locked = await locked_waiting(conn, ids)
    if not locked:
        return []
    named = await conn.fetch(
        "SELECT DISTINCT unnest(job_ids) AS id FROM jobqueue_batches "
        "WHERE pg_xact_status(CAST(CAST(xid AS text) AS xid8)) = 'in progress'")
    return sorted(set(locked) & {r["id"] for r in named})


async def fate(conn: asyncpg.Connection, crew: Crew, ids: Sequence[uuid.UUID]
               ) -> dict[str, list[Any]]:
    """What became of the jobs `ids`, as the distinct values they show, so
    that the same facts print however many jobs there are: their status,
    `retry_count`, the worker (label) they are under, how many rows each has
    in `lab_writes` (its committed runs) and the attempts those rows recorded."""
    await crew.workers(conn)
    rows = await conn.fetch(
        "SELECT j.status, j.retry_count, j.worker_id, "
        "(SELECT count(*) FROM lab_writes AS w WHERE w.job_id = j.id) AS writes, "
        "ARRAY(SELECT w.attempt FROM lab_writes AS w WHERE w.job_id = j.id) AS attempts "
        "FROM jobqueue_all_jobs AS j WHERE j.id = ANY($1)", list(ids))
    if len(rows) != len(ids):
        raise LookupError(f"{len(ids) - len(rows)} of the jobs do not exist")

    def worker(worker_id: int | None) -> str:
        return "nobody" if worker_id is None else crew.labels.get(worker_id, "other")

    return {"status": sorted({r["status"] for r in rows}),
            "retry_count": sorted({r["retry_count"] for r in rows}),
            "worker": sorted({worker(r["worker_id"]) for r in rows}),
            "rows in lab_writes": sorted({r["writes"] for r in rows}),
            "attempts written": sorted({a for r in rows for a in r["attempts"]})}


async def jobs_health(conn: asyncpg.Connection, ids: Sequence[uuid.UUID]) -> dict[str, int]:
    """Every job of `ids` accounted for: how many exist, and how many in each status."""
    counts = dict.fromkeys(("completed", "processing", "pending", "retrying", "failed"), 0)
    for r in await conn.fetch(
            "SELECT status, count(*) AS n FROM jobqueue_all_jobs "
            "WHERE id = ANY($1) GROUP BY status",
            list(ids)):
        counts[r["status"]] = int(r["n"])
    return {"enqueued": len(ids), "found": sum(counts.values()), **counts}


async def completed_count(conn: asyncpg.Connection, ids: Sequence[uuid.UUID]) -> int:
    return int(await conn.fetchval(
        "SELECT count(*) FROM jobqueue_all_jobs WHERE id = ANY($1) AND status = 'completed'",
        list(ids)))


async def wait_completed(conn: asyncpg.Connection, ids: Sequence[uuid.UUID], at_least: int,
                         timeout: float = 60.0) -> int:
    """Until at least `at_least` of `ids` are completed; how many are."""

    async def enough() -> int:
        n = await completed_count(conn, ids)
        return n if n >= at_least else 0

    return int(await wait_for(enough, timeout=timeout,
                              message=f"{at_least} completed jobs"))


async def catch_claimed(conn: asyncpg.Connection, crew: Crew, label: str,
                        ids: Sequence[uuid.UUID]) -> tuple[list[uuid.UUID], datetime]:
    """Freeze worker `label` while it holds claimed jobs (`processing` under
    its id); those jobs and the instant of the freeze. It stays frozen."""
    return await crew.freeze_holding(conn, label, lambda: held_by(conn, crew, label),
                                     lambda: completed_count(conn, ids))


async def catch_quick_batch(conn: asyncpg.Connection, crew: Crew, label: str,
                            ids: Sequence[uuid.UUID]) -> tuple[list[uuid.UUID], datetime]:
    """Freeze worker `label` while a quick batch of it holds jobs of `ids`
    locked (still waiting, never written) and has written them down in the
    ledger (`written_down`); those jobs and the instant."""
    return await crew.freeze_holding(conn, label, lambda: written_down(conn, ids),
                                     lambda: completed_count(conn, ids))


async def wait_released(conn: asyncpg.Connection, ids: Sequence[uuid.UUID],
                        timeout: float = 30.0) -> None:
    """Until no open transaction holds any waiting job of `ids` locked."""

    async def released() -> bool:
        return not await locked_waiting(conn, ids)

    await wait_for(released, timeout=timeout, message="locks released")

