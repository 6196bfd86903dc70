"""Render BENCHMARKS.md and its plots from the results files:
`python -m jobqueue.benchmarks.report` (the last step of `make bench`).

Every number in the document is read from `notebooks/benchmarks/results/*.csv`
and shown in a table, with a flag where a figure needs one; the text beside
the tables is fixed, written once, and says what is measured and how.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import pandas as pd

from jobqueue.benchmarks import context as results_context
from jobqueue.benchmarks import load, peers, plots, run_record

CHECKOUT = Path(__file__).resolve().parents[2]
RESULTS = CHECKOUT / "notebooks" / "benchmarks" / "results"


def _figure(fig: Any, name: str, out: Path) -> str:
    path = out / f"{name}.png"
    fig.savefig(path, dpi=110)
    matplotlib.pyplot.close(fig)
    return f"![{name}]({_shown(path)})"


def _setup(context: dict[str, str]) -> str:
    return "\n".join([
        "## Setup", "",
        f"- Machine: {context.get('cpu', '?')}, {context.get('cores', '?')} cores, "
        f"{context.get('ram', '?')} RAM",
        f"- PostgreSQL: {context.get('postgres', '?')}",
        f"- Settings: fsync={context.get('fsync')}, "
        f"synchronous_commit={context.get('synchronous_commit')}, "
        f"shared_buffers={context.get('shared_buffers')} (the embedded server's defaults: "
        "durable commits)",
        "- Workers are real `jobqueue worker` processes on the same machine as the server; "
        "times are read from PostgreSQL's clock.",
    ])


# -- the fixed text: what each table measures, and how, said once -----------------

THROUGHPUT_NOTE = (
    f"Draining no-op jobs already in the table, each drain sized from the rate the one before "
    f"it measured so that it lasts {plots.MIN_DRAIN_SECONDS:g} s or more (a shorter one is run "
    "again bigger, and flagged if it still is); median jobs/s of the runs (min–max), timed "
    "from the first claim to the last completion. *workers used* is how many worker processes "
    "took jobs (in exclusive mode one works and the others stand by; in shared mode all "
    "should); *last joined* is how long after the first claim the last of them made its own "
    "first one. The flags say which settings fall short of that, and which is the fastest "
    "setting that does not.")
TABLE_SIZE_NOTE = (
    "One exclusive worker at batch 1,000. The claim reads the partial index of pickable jobs, "
    "so finished rows should not slow it down. *dead tuples after* is the jobs table's "
    "`n_dead_tup` when the drain ended (the statistics can lag a second); WAL, full-page "
    "images and checkpoints are what the drain cost the server.")
SOAK_NOTE = (
    "Jobs arrive at a fixed rate for the seconds in the table on one worker at its defaults, "
    "completed jobs kept for *kept* seconds, then pruned; the jobs table's rows and size and "
    "the worker's memory sampled every second. A healthy queue draws no line that climbs: "
    "pruning deletes in bursts, autovacuum (at 2 % dead rows, looked at every 10 s) takes "
    "them back. Flagged: dead rows or table size still climbing in the last third (over 1.5× "
    "the second third's peak), worker memory up over 10 %.")
WORK_NOTE = (
    "`write_row` inserts one row through the handler's session (it commits with the job); "
    "`sleep_10ms` waits 10 ms, like a call to another service: for such jobs lanes "
    "(`--concurrency`) and processes bound the rate (100 jobs/s per lane), not the batch.")
ROUTING_NOTE = (
    "The same no-op jobs in one queue at one priority, then spread evenly over several queues "
    "and priorities (interleaved in the table, so that none comes first), drained by one "
    "worker process; *× the first setup* is the median against one queue at one priority. "
    "*completed after a lower priority* counts the jobs that completed after a job of lower "
    "priority in their own queue had (jobs committed together count as at once): when every "
    "lane serves every queue, two lanes can hold batches of one queue at once, and the one "
    "with the lower priorities may commit first.")
SYNC_NOTE = (
    "The same work done by an async handler and by a sync (plain `def`) one, which the worker "
    "runs in threads, each drained by one worker process at the CLI's defaults. A sync job "
    "pays two commits of its own (its claim, then its writes with its outcome), a thread "
    "hand-off and a sync session; async jobs in a quick batch share one commit.")
LATENCY_NOTE = (
    "Jobs arrive one at a time, each in its own transaction, at a fixed rate that does not "
    "wait for the queue (open loop); one idle worker, woken by LISTEN/NOTIFY. Enqueue = the "
    "row's insertion; start and completion as the worker recorded them. The warm-up of each "
    "run is left out; each quantile pools the runs' samples at a rate and is shown only where "
    "they carry it (a q-quantile needs 1/(1 − q) samples: p99 100, p99.9 1,000; \"–\" "
    f"otherwise); a rate the producer kept under {plots.MET_SHARE:.0%} of is flagged and "
    "drawn hollow at the rate achieved: it measures the producer, not the queue.")
RECOVERY_NOTE = (
    "Recovery is the time from the signal to the first job the standby completes, on the "
    "database's clock. After a crash (SIGKILL) the dead worker's connections close and its "
    "advisory locks go with them: the standby, blocked in `pg_advisory_lock`, takes over at "
    "once. After a hang (SIGSTOP) its connections stay open, so the standby waits until the "
    "last heartbeat is older than the lease, then fences it off (terminates its backends). "
    "*held at the signal*: the dead worker's `processing` jobs (none on the quick path, whose "
    "batch dies with its transaction); *left processing*: those still `processing` when the "
    "standby completed its first job; every held job must complete exactly once.")
FAILOVER_NOTE = (
    "No failover manager ran here: the standby was promoted the moment the primary died, so "
    "a real one adds its own time to decide. After the promotion, the worker reconnects (with "
    "backoff), starts a new life on the new primary and runs its first batch. Every job must "
    "complete exactly once, and the jobs completed before the kill must still be on the new "
    "primary.")
PEERS_NOTE = (
    "Each system runs as real worker processes in the configuration its own documentation "
    "advises for throughput, with the same numbers of processes as jobqueue (listed under "
    "each table). jobqueue runs as the README starts it, `jobqueue worker --import MODULE`, "
    "stopped with SIGTERM once the jobs are done; every label is read back from the arguments "
    "the processes were given. Besides no-op jobs, two kinds of real work, the same in every "
    "system: `write_row` INSERTs one row; `process_payment` (the seed's handler) UPDATEs a "
    "user's balance and INSERTs the payment in one transaction. Each peer's task writes "
    "through a pool of its own, as its docs show (PgQueuer an asyncpg pool passed as a shared "
    "resource, Procrastinate its connector's pool, oban-py a psycopg pool of the tasks' own, "
    "graphile-worker `helpers.query` and `helpers.withPgClient`); jobqueue's handlers write "
    "through the session it hands them, in the batch's transaction. Every drain checks that "
    "each job ran once and wrote exactly its rows. Throughput comes from the timestamps each "
    "system writes on PostgreSQL's clock (claimed: `jobs.started_at`, PgQueuer's `picked` log "
    "row, Procrastinate's `started` event, oban-py's `attempted_at`, graphile-worker's "
    "`locked_at`; completion recorded: `jobs.completed_at`, `successful`, `succeeded`, "
    "`completed_at`; graphile-worker keeps no record of a completion, so its drain ends at "
    "the first 10 ms sample that finds its jobs table empty). The course's design runs in the "
    "benchmark's own process, timed by its client clock.")
DRAIN_NOTE = (
    "Jobs already queued; median jobs/s of the rounds (min–max), every setup once per round, "
    "one after another. `n` is the number of jobs each drain ran: the slowest setups drain "
    "fewer, so that a run lasts seconds rather than minutes. Peak RSS is the largest resident "
    "memory any of the setup's worker processes reached.")
PEER_LATENCY_NOTE = (
    "Jobs enqueued one at a time, each in its own transaction, at a fixed rate that does not "
    "wait for the queue (open loop), by the same asyncpg producer for every system; one idle "
    "worker per system, woken by its own LISTEN/NOTIFY. The warm-up of each run is left out, "
    "the next seconds counted (both in the table). A percentile is shown only where the run's "
    "counted jobs carry it (p99 from 100 jobs, p99.9 from 1,000; \"–\" otherwise). A rate the "
    "producer did not reach (under 95 % of it) is plotted at the rate achieved, hollow, and "
    "flagged, as is a system that fell behind (completed under 95 % of the arrival rate): its "
    "latency is a backlog that grows with the run, not a wake-up.")
#: Under the no-op drains: why two systems sit orders of magnitude below the others.
PER_JOB_COMMITS = (
    "Procrastinate and the course design commit per job (Procrastinate twice: the claim, "
    "then the completion): every job waits for a durable commit of its own. PgQueuer, "
    "oban-py, graphile-worker and jobqueue claim in batches; jobqueue also records a "
    "batch's completions in the same transaction.")
#: Under the latency comparison: PgQueuer's gap between start and recorded completion.
PGQUEUER_BUFFER = (
    "PgQueuer's gap between a job's start and its recorded completion is its completion "
    "buffer: PgQueuer 1.6 writes finished jobs when the buffer holds `batch_size` of them or "
    "about every 0.1 s (`JobStatusLogBuffer`, `pgqueuer/core/buffers.py`), in a statement of "
    "their own.")
PRESSURE_NOTE = (
    "A session that keeps a transaction open pins the xmin horizon: from then on vacuum can "
    "remove no row version that died after it began, and every finished job's dead versions "
    "stay in the queue's tables and indexes for each claim to step over. Each system in turn, "
    "in its own database, with one worker process configured as in the comparison above, "
    "goes through the phases of the table (*s*: seconds) with the producer running through "
    "all of them: jobs arrive one at a time, each in its own transaction, at scheduled times "
    "(open loop), through the same asyncpg producer. The *holder* is a session that ran "
    "`SELECT pg_current_xact_id()` in a transaction it leaves open; *RR readers* each keep "
    "one REPEATABLE READ transaction open and scan the system's tables with `count(*)`. "
    "Before the phases, a drain measures what the worker sustains; the load phase asks for "
    "that multiple of it, capped at what one producer sends, and a system that sustains less "
    "than the base rate gets a share of what it sustains. Latency is enqueue → completion from "
    "each system's own timestamps, of the jobs enqueued in the phase, p99 only where 100 jobs "
    "carry it. Dead tuples and sizes are the system's own tables at the phase's last sample; "
    "wait events are what its active sessions waited on (`CPU`: none). An arrival that would "
    "have waited over a second to be sent is dropped, so that every phase lasts what it says. "
    f"The issue's goal for jobqueue: with the horizon pinned for "
    f"{plots.GOAL_PINNED_S / 60:g} minutes at {plots.GOAL_RATE:g} jobs/s, p99 within "
    f"{plots.GOAL_FACTOR:g}× its own baseline and below every peer's, and back to baseline "
    f"within {plots.GOAL_RECOVERY_S:g} s of the release; a row that misses it is flagged.")


# -- the sections --------------------------------------------------------------------


def _table_figure(results: Path, name: str, table: pd.DataFrame, fig: Any,
                  floatfmt: str = ",.0f") -> list[str]:
    return [plots.markdown(table, floatfmt), "", _figure(fig, name, results), ""]


def _throughput(results: Path) -> str:
    df, _ = load("throughput_matrix", results)
    lines = ["## Throughput", "", THROUGHPUT_NOTE, "",
             *_table_figure(results, "throughput", plots.throughput_table(df),
                            plots.throughput_plot(df))]
    if (results / "throughput_table_size.csv").exists():
        sdf, _ = load("throughput_table_size", results)
        lines += ["### Does cost grow with the table?", "", TABLE_SIZE_NOTE, "",
                  *_table_figure(results, "table_size", plots.table_size_table(sdf),
                                 plots.table_size_plot(sdf))]
    if (results / "throughput_soak.csv").exists():
        summary, _ = load("throughput_soak", results)
        timeline, _ = load("throughput_soak_timeline", results)
        lines += ["### A long run: does the table stay healthy?", "", SOAK_NOTE, "",
                  *_table_figure(results, "soak", plots.soak_table(summary),
                                 plots.soak_plot(timeline), ",.1f")]
    if (results / "throughput_work.csv").exists():
        wdf, _ = load("throughput_work", results)
        lines += ["### Jobs that do something", "", WORK_NOTE, "",
                  plots.markdown(plots.work_table(wdf)), ""]
    if (results / "throughput_routing.csv").exists():
        lines += _routing(results)
    if (results / "throughput_sync.csv").exists():
        lines += _sync(results)
    return "\n".join(lines).rstrip("\n")


def _routing(results: Path) -> list[str]:
    rdf, _ = load("throughput_routing", results)
    spans, _ = load("throughput_routing_spans", results)
    return ["### Queues and priorities", "", ROUTING_NOTE, "",
            *_table_figure(results, "routing", plots.routing_table(rdf),
                           plots.routing_plot(spans, rdf))]


def _sync(results: Path) -> list[str]:
    sdf, _ = load("throughput_sync", results)
    return ["### Sync handlers beside async ones", "", SYNC_NOTE, "",
            plots.markdown(plots.sync_table(sdf)), ""]


def _latency(results: Path) -> str:
    df, _ = load("latency", results)
    samples, _ = load("latency_samples", results)
    return "\n".join([
        "## Latency", "", LATENCY_NOTE, "",
        *_table_figure(results, "latency", plots.latency_table(df, samples),
                       plots.latency_plot(df, samples), ",.1f"),
        _figure(plots.latency_histogram(samples), "latency_histogram", results)])


def _recovery(results: Path) -> str:
    times, _ = load("recovery", results)
    timeline, _ = load("recovery_timeline", results)
    lines = [
        "## Dead-worker recovery", "",
        "The active worker is killed (SIGKILL) or frozen (SIGSTOP) while it works through a "
        "stream of jobs; both workers run "
        f"`jobqueue worker {plots.recovery_common_flags(times, 'argv')}` plus the setup's own "
        f"flags. {RECOVERY_NOTE}", "",
        *_table_figure(results, "recovery_timeline", plots.recovery_table(times),
                       plots.recovery_timeline_plot(timeline, times), ",.3f"),
        _figure(plots.recovery_times_plot(times), "recovery_times", results)]
    if (results / "recovery_failover.csv").exists():
        times, _ = load("recovery_failover", results)
        timeline, _ = load("recovery_failover_timeline", results)
        lines += [
            "", "### PostgreSQL failover", "",
            "A primary and its synchronous standby (embedded, on this machine); one worker, "
            f"`jobqueue worker {times['argv'].iloc[0]}`, with a DATABASE_URL naming both "
            "(`target_session_attrs=read-write`), works through a stream of "
            f"{int(times['jobs'].iloc[0]):,} jobs of {times['job_ms'].iloc[0]:g} ms; the "
            "primary's postmaster gets SIGKILL and the standby is promoted at once. Times on "
            "the servers' clock; the lost server is rebuilt as the standby between trials. "
            + FAILOVER_NOTE, "",
            *_table_figure(results, "recovery_failover_timeline", plots.failover_table(times),
                           plots.failover_timeline_plot(timeline, times), ",.3f")]
    return "\n".join(lines).rstrip("\n")


def configuration_notes(df: pd.DataFrame) -> list[str]:
    """Beside a table or figure: for each system in `df`, the setups it ran
    (their labels, read back from the arguments the runs used) and what its
    documentation advises for throughput (`peers.RECOMMENDED`, with the page)."""
    lines = ["Configuration of each system, as run here and as its documentation advises:", ""]
    for system in plots.systems(df):
        ran = "; ".join(dict.fromkeys(
            plots.plain_settings(x) for x in df[df["system"] == system]["settings"]))
        advice, links = peers.RECOMMENDED[system]
        pages = ", ".join(f"[{name}]({url})" for name, url in links)
        lines.append(f"- **{plots.SYSTEM_NAMES[system]}**, run as: {ran}. "
                     f"{advice}{f' ({pages})' if pages else ''}")
    return lines


def _peers(results: Path) -> str:
    """jobqueue beside its peers (`comparison.ipynb`)."""
    _, context = load("comparison_drain", results)
    versions = ", ".join(f"{plots.SYSTEM_NAMES[k.removesuffix('_version')]} {v}"
                         for k, v in context.items() if k.endswith("_version"))
    lines = ["## Beside its peers: PgQueuer, Procrastinate, oban-py, graphile-worker and the "
             "course's design", "",
             f"Same server, one run ({versions or 'peer versions unknown'}). {PEERS_NOTE}", ""]
    for name, handler in COMPARISON_DRAINS:
        if (results / f"{name}.csv").exists():
            df, _ = load(name, results)
            lines += [f"### Draining {plots.usual_n(df):,} {plots.WORKLOADS[handler]}", "",
                      DRAIN_NOTE, "", plots.markdown(plots.peer_drain_table(df)), "",
                      *configuration_notes(df), "",
                      _figure(plots.peer_drain_plot(df), name, results), "",
                      *([PER_JOB_COMMITS, ""] if handler == "noop" else [])]
    if (results / "comparison_latency.csv").exists():
        df, _ = load("comparison_latency", results)
        samples, _ = load("comparison_latency_samples", results)
        lines += ["### Latency under open-loop arrivals", "", PEER_LATENCY_NOTE, "",
                  plots.markdown(plots.peer_latency_table(df), ",.1f"), "",
                  *configuration_notes(df), "",
                  _figure(plots.peer_latency_plot(df), "comparison_latency", results), "",
                  _figure(plots.peer_latency_cdf(samples), "comparison_latency_cdf", results),
                  "", PGQUEUER_BUFFER, ""]
    if (results / "comparison_memory.csv").exists():
        df, _ = load("comparison_memory", results)
        timeline, _ = load("comparison_memory_timeline", results)
        lines += ["### Memory over a long drain", "",
                  "One worker drains a large table while its resident memory (VmRSS) is read "
                  "every quarter second from outside the process.", "",
                  plots.markdown(plots.peer_memory_table(df), ",.2f"), "",
                  *configuration_notes(df), "",
                  _figure(plots.peer_memory_plot(timeline), "comparison_memory", results)]
    return "\n".join(lines).rstrip("\n")


def _pressure(results: Path) -> str:
    """The queues while vacuum is held back (`pressure.ipynb`)."""
    df, context = load("pressure", results)
    timeline, _ = load("pressure_timeline", results)
    lines = [
        "## Under pressure: vacuum held back", "", PRESSURE_NOTE, "",
        f"This run: {', '.join(plots.SYSTEM_NAMES[s] for s in plots.systems(df))}; load capped "
        f"at {context.get('pressure_max_rate', '?')} jobs/s, the first "
        f"{context.get('pressure_warmup', '?')} s left out, wait events sampled every "
        f"{context.get('pressure_interval', '?')} s, the figure's windows "
        f"{context.get('pressure_window', '?')} s.", "",
        plots.markdown(plots.pressure_table(df, timeline), ",.1f"), "",
        *configuration_notes(df), "",
        _figure(plots.pressure_plot(timeline, df), "pressure", results)]
    probes = plots.probe_table(df)
    if not probes.empty:
        lines += ["", "jobqueue's claim at the end of each phase (EXPLAIN (ANALYZE, BUFFERS) "
                  "of `take`, as a lane sends it, in a transaction rolled back):", "",
                  plots.markdown(probes)]
    return "\n".join(lines)


def _ceiling(results: Path) -> str:
    df, context = load("ceiling", results)
    table = pd.DataFrame({
        "per job": df["name"], "what it is": df["what"],
        "wall µs": df["wall_us"], "client CPU µs": df["client_cpu_us"],
        "server CPU µs": df["server_cpu_us"],
        "jobs/s": df["jobs_per_sec"].round().astype(int)})
    return "\n".join([
        "## Where a job's time goes", "",
        f"`python -m jobqueue.benchmarks.ceiling --save`: each row repeats one thing "
        f"{int(df['n'].min()):,} times on one connection (the queue-statement rows: "
        f"{int(df['n'].max()):,} no-op jobs), median of {int(df['repeat'].iloc[0])} runs; "
        f"event loop: {context.get('event_loop', '?')}; written "
        f"{context.get('written', '?')}. The bare INSERT is PostgreSQL's part; the rest of a "
        "session's row is the client's (SQLAlchemy's statement path and the event loop).", "",
        plots.markdown(table, floatfmt=",.1f")])


def _comparison(results: Path) -> str:
    one = plots.counted(load("throughput_matrix", results)[0])
    one = one[(one["mode"] == "exclusive") & (one["workers"] == 1)]
    per_job = plots.spread(one, ["batch_size"], "jobs_per_sec")
    batch1 = per_job[per_job["batch_size"] == per_job["batch_size"].min()]["median"].iloc[0]
    course_line = []
    if (results / "throughput_course.csv").exists():
        c = plots.spread(load("throughput_course", results)[0], ["n"], "jobs_per_sec").iloc[0]
        course_line = [
            f"The course's own design (a transaction and ORM round trips per job, reproduced in "
            f"`jobqueue/benchmarks/course.py`) drains {c['median']:,.0f} jobs/s "
            f"({c['min']:,.0f}–{c['max']:,.0f}, {int(c['runs'])} runs of {int(c['n']):,} jobs) "
            "on the same server.", ""]
    return "\n".join([
        "## This vs Celery + Redis (the course's table, redone)", "", *course_line,
        "| | jobqueue (measured here) | Celery + Redis |", "|---|---|---|",
        "| Setup | PostgreSQL only | PostgreSQL for the data, plus Redis and Celery workers |",
        f"| Throughput, one worker | {batch1:,.0f} jobs/s committing every job; "
        f"{per_job['median'].max():,.0f} jobs/s with batches | not measured here (no Celery "
        "run on this machine yet); the course's 500–1,000/s is unsourced |",
        "| Persistence | a row in PostgreSQL, committed with the enqueuing transaction | "
        "in Redis memory, durable only as far as its AOF/RDB settings |",
        "| Job and data atomic | yes: enqueue joins the caller's transaction; a handler's "
        "writes commit with the job's completion | no: the broker and the database commit "
        "separately |",
        "| Retry logic | built in, exponential backoff with jitter, every attempt in "
        "`error_history` | built in (`autoretry_for`, `retry_backoff`) |",
        "| Visibility | `SELECT * FROM jobs`, `jobqueue status` | Redis CLI, Flower |",
        "| Operational cost | nothing beyond the database | a Redis instance to run and watch |",
    ])


def _limits(results: Path) -> str:
    frames = [pd.read_csv(path, comment="#", usecols=lambda column: column == "workers")
              for path in sorted(results.glob("*.csv"))]  # that column only
    most = max((int(f["workers"].dropna().max()) for f in frames
                if "workers" in f.columns and f["workers"].notna().any()), default=1)
    lines = ["## Known limits of these figures", "",
             "- One 2-core machine runs the server, the workers and the producer: they compete "
             "for CPU, so the figures are lower than on a real database host; the most worker "
             f"processes any setup of this run used is {most}."]
    rows = (load("ceiling", results)[0].set_index("name")["wall_us"]
            if (results / "ceiling.csv").exists() else pd.Series(dtype=float))
    commit = (f"a commit costs about {rows['INSERT + COMMIT'] - rows['INSERT']:,.0f} µs here "
              "(the ceiling table: an INSERT committed on its own, minus the INSERT), which "
              "bounds" if {"INSERT + COMMIT", "INSERT"} <= set(rows.index) else
              "the cost of a commit bounds")
    lines += [f"- Durable settings (fsync and synchronous_commit on) on a virtual disk: "
              f"{commit} every per-job-commit figure.",
              "- The producer of the latency runs is one Python process; at the highest rates "
              "its own lag is reported in the results file (`producer_late_p99_ms`)."]
    if (results / "pressure.csv").exists():
        df, _ = load("pressure", results)
        held = df[df["pinned"].astype(bool)].groupby("system")["seconds"].sum()
        if len(held) and held.max() < plots.GOAL_PINNED_S:
            lines.append(f"- The pressure run pins the horizon for {held.max():,.0f} s, not the "
                         f"{plots.GOAL_PINNED_S / 60:g} minutes of the issue's goal "
                         "(`make bench-pressure` runs those).")
    return "\n".join(lines)


SECTIONS: Sequence[tuple[str, Callable[[Path], str]]] = (
    ("throughput_matrix", _throughput),
    ("latency", _latency),
    ("recovery", _recovery),
    ("comparison_drain", _peers),
    ("pressure", _pressure),
    ("ceiling", _ceiling),
)


# -- the headline table: jobqueue at its CLI defaults against each peer's best -------

#: The comparison's drain results, one file per workload (what the jobs do).
COMPARISON_DRAINS = (("comparison_drain", "noop"), ("comparison_write_row", "write_row"),
                     ("comparison_process_payment", "process_payment"))
LEAD = "lead (×)"
#: What the headline table's columns mean, said once above it.
LEGEND = (f"`{LEAD}`: jobqueue's figure over the peer's for a drain (jobs/s), the peer's over "
          "jobqueue's for a latency (ms); above 1, jobqueue is ahead. jobqueue runs as the "
          "README starts it (one process, the CLI's defaults); each peer at its best setup of "
          "the run, named beside its figure. Medians of each setup's rounds.")


def _run(results: Path, name: str) -> str:
    stamp = results_context(name, results)
    return f"{stamp.get('run', '?')[:16].replace('T', ' ')}, `{stamp.get('commit', '?')[:8]}`"


def _ms(value: float) -> str:
    """Two decimals under 10 ms (a goal of 1.5 ms must not read as met by
    rounding), one above."""
    return "–" if pd.isna(value) else f"{value:,.{2 if value < 10 else 1}f}"


def headline_table(results: Path) -> pd.DataFrame:
    """jobqueue as the README starts it (one process, the CLI's defaults)
    against each peer's best setup of the same run, whatever its processes,
    on each drain workload and at the lowest latency rate (empty when the
    comparison has not run). The detailed sections compare like for like."""
    rows: list[dict[str, Any]] = []
    for name, handler in COMPARISON_DRAINS:
        if not (results / f"{name}.csv").exists():
            continue
        s = plots.peer_drain_spread(load(name, results)[0])
        mine = s[(s["system"] == "jobqueue") & (s["preset"] == peers.CLI_DEFAULTS)]
        if mine.empty:
            continue
        ours = mine.loc[mine["median"].idxmax()]
        for system in peers.PEERS:
            of = s[s["system"] == system]
            if of.empty:
                continue
            theirs = of.loc[of["median"].idxmax()]
            flags = ([f"{plots.SYSTEM_NAMES[system]} drained {theirs['n']:,} jobs, jobqueue "
                      f"{ours['n']:,}"] if theirs["n"] != ours["n"] else [])
            flags += ["one round"] if min(theirs["runs"], ours["runs"]) < 2 else []
            rows.append({"workload": f"drain, {handler} (jobs/s)",
                         "jobqueue": f"{ours['median']:,.0f}",
                         "peer": f"{plots.SYSTEM_NAMES[system]}: {theirs['median']:,.0f} "
                                 f"({plots.short_settings(theirs['settings'])})",
                         LEAD: ours["median"] / theirs["median"], "flag": "; ".join(flags),
                         "run": _run(results, name)})
    if (results / "comparison_latency.csv").exists():
        med = plots.peer_latency_runs(load("comparison_latency", results)[0])
        low = med[med["rate"] == med["rate"].min()]
        ours_rows = low[low["system"] == "jobqueue"]
        for system in peers.PEERS if len(ours_rows) else ():
            found = low[low["system"] == system]
            if found.empty:
                continue
            mine, theirs = ours_rows.iloc[0], found.iloc[0]
            flags = [f"{who}: {flag}" for who, flag in (
                ("jobqueue", plots.latency_flag(mine)),
                (plots.SYSTEM_NAMES[system], plots.latency_flag(theirs))) if flag != "met"]
            for q in ("50", "99"):
                column = f"complete_p{q}_ms"
                lead = theirs[column] / mine[column]
                rows.append({"workload": f"enqueue → completion p{q} at {mine['rate']:,.0f} "
                                         "jobs/s (ms)",
                             "jobqueue": _ms(mine[column]),
                             "peer": f"{plots.SYSTEM_NAMES[system]}: {_ms(theirs[column])} "
                                     f"({theirs['settings']})",
                             LEAD: float("nan") if pd.isna(lead) else lead,
                             "flag": "; ".join(flags) or ("" if not pd.isna(lead) else
                                                          "the sample does not carry it"),
                             "run": _run(results, "comparison_latency")})
    return pd.DataFrame(rows)


def headline(results: Path) -> list[str]:
    """The legend and the headline table as Markdown lines ([] without results)."""
    found = headline_table(results)
    if found.empty:
        return []
    found[LEAD] = found[LEAD].map(lambda v: "–" if pd.isna(v) else f"{v:,.2f}")
    legend = LEGEND
    if found["run"].nunique() == 1:  # said once rather than on every row
        legend += f" Every row is from the run started {found['run'].iloc[0]}."
        found = found.drop(columns="run")
    return [legend, "", plots.markdown(found)]


# -- the document --------------------------------------------------------------------


def _clock(seconds: float) -> str:
    return f"{int(seconds) // 60} min {int(seconds) % 60:02d} s"


def _header(results: Path, record: dict[str, Any], context: dict[str, str]) -> str:
    where = f"the results files in `{_shown(results)}/`"
    if not record:
        return (f"Generated by `python -m jobqueue.benchmarks.report` from {where}, written "
                f"{context.get('written', '?')}, with no record of the run that wrote them.")
    steps = record.get("steps", {})
    took = ", ".join(f"{name} {_clock(t)}" for name, t in steps.items())
    line = (f"Generated by `make bench` from one run: started {record['started']} at commit "
            f"`{record['commit']}`, {_clock(sum(steps.values()))} in all ({took}); "
            f"every results file in `{_shown(results)}/` carries that stamp, and each section "
            "below says which run it comes from.")
    line += _overrides(record.get("overrides"))
    for rerun in record.get("reruns", []):
        line += (f" **Partial rerun** started {rerun['started']} at commit `{rerun['commit']}`: "
                 f"{', '.join(rerun['notebooks'])} (marked in its sections)."
                 + _overrides(rerun.get("overrides")))
    return line + " Do not edit by hand: rerun `make bench` on your machine to get your own."


def _overrides(overrides: dict[str, str] | None) -> str:
    """The notebook parameters a run set from the environment."""
    if not overrides:
        return ""
    return (" It set, over the notebooks' full size: "
            + ", ".join(f"`{key}={value}`" for key, value in sorted(overrides.items())) + ".")


def stamp(results: Path, name: str, record: dict[str, Any], cpu: str | None = None) -> str:
    """Which run a section's results files come from: the full run of the
    header, or, marked as such, another one, with its machine when it is not
    `cpu`, the Setup's: a rerun elsewhere is not comparable figure by figure."""
    runs: dict[tuple[str, str, str], list[str]] = {}
    for path in sorted(results.glob(f"{name.split('_')[0]}*.csv")):
        of = results_context(path.stem, results)
        runs.setdefault((of.get("run", "?"), of.get("commit", "?"), of.get("cpu", "?")),
                        []).append(path.name)
    if [(run, commit) for run, commit, _ in runs] == [(record.get("started"),
                                                       record.get("commit"))]:
        return (f"*From the run above (started {record['started']}, commit "
                f"`{record['commit']}`).*")
    parts = [f"run {run} at commit `{commit}`"
             + ("" if machine in (cpu, "?") or cpu is None
                else f" on another machine ({machine})")
             + f" ({', '.join(files)})"
             for (run, commit, machine), files in runs.items()]
    return "**Not from the run above**: " + "; ".join(parts) + "."


def render(results: Path = RESULTS, target: Path = CHECKOUT / "BENCHMARKS.md") -> Path:
    """Write `target` (BENCHMARKS.md) and the PNGs, beside the results files."""
    available = [(name, fn) for name, fn in SECTIONS if (results / f"{name}.csv").exists()]
    if not available:
        raise FileNotFoundError(f"no results in {results}: run `make bench` first")
    context = results_context(available[0][0], results)
    record = run_record(results)
    body = ["# jobqueue — benchmarks", _header(results, record, context)]
    glance = headline(results)
    if glance:
        body.append("\n".join(["## At a glance: jobqueue against each peer", "", *glance]))
    body.append(_setup(context))
    for name, fn in available:
        title, _, rest = fn(results).partition("\n")
        body.append(f"{title}\n\n{stamp(results, name, record, context.get('cpu'))}\n{rest}")
    if (results / "throughput_matrix.csv").exists():
        body.append(_comparison(results))
    body.append(_limits(results))
    target.write_text("\n\n".join(body) + "\n")
    return target


def _shown(path: Path) -> str:
    """A path as the document shows it: relative to the checkout when inside it."""
    try:
        return path.resolve().relative_to(CHECKOUT).as_posix()
    except ValueError:
        return path.as_posix()


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m jobqueue.benchmarks.report", description=__doc__)
    p.add_argument("--results", type=Path, default=RESULTS, help="folder of results files")
    p.add_argument("--output", type=Path, default=CHECKOUT / "BENCHMARKS.md")
    args = p.parse_args(argv)
    # No window for the figures; chosen here, not at import, so that a
    # notebook importing this module keeps its inline figures.
    matplotlib.use("Agg")
    print(f"wrote {render(args.results, args.output)}")


if __name__ == "__main__":
    main()
