"""Render BENCHMARKS.md and its plots from the results files:
`python -m jobqueue.benchmarks.report` (the last step of `make bench`).

Every number in the document is read from `notebooks/benchmarks/results/*.csv`;
the sentences that comment on them are computed from the same numbers.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import pandas as pd

from jobqueue.benchmarks import load, peers, plots

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


def _throughput(results: Path) -> str:
    df, _ = load("throughput_matrix", results)
    s = plots.spread(df, ["mode", "workers", "batch_size"], "jobs_per_sec")
    best = s.loc[s["median"].idxmax()]
    one = s[(s["mode"] == "exclusive") & (s["workers"] == 1)].set_index("batch_size")["median"]
    gain = one.max() / one.min() if one.min() > 0 else float("nan")
    lines = [
        "## Throughput", "",
        f"Draining {int(df['n'].iloc[0]):,} no-op jobs already in the table; median jobs/s of "
        f"{int(s['runs'].max())} runs (min–max), timed from the first claim to the last "
        "completion.", "",
        plots.markdown(plots.throughput_table(df)), "",
        _figure(plots.throughput_plot(df), "throughput", results), "",
        f"The batch size is the lever: one exclusive worker goes {gain:,.0f}× faster from "
        f"batch {int(one.idxmin())} to batch {int(one.idxmax())}, because a durable commit is "
        "paid once per batch instead of once per job.",
        f"The best setting here is {best['mode']} mode, {int(best['workers'])} worker(s), batch "
        f"{int(best['batch_size'])}: {best['median']:,.0f} jobs/s. {_modes_sentence(s)}",
    ]
    if (results / "throughput_table_size.csv").exists():
        sdf, _ = load("throughput_table_size", results)
        ss = plots.spread(sdf, ["n"], "jobs_per_sec")
        # Compared with 10,000 jobs when measured (the smallest tables finish
        # in tens of milliseconds, where start-up noise dominates).
        base_rows = ss[ss["n"] == 10_000]
        first = base_rows.iloc[0] if len(base_rows) else ss.iloc[0]
        last = ss.iloc[-1]
        change = (last["median"] / first["median"] - 1) * 100
        before_last = ss.iloc[-2] if len(ss) > 2 else first
        lines += [
            "", "### Does cost grow with the table?", "",
            plots.markdown(plots.table_size_table(sdf)), "",
            _figure(plots.table_size_plot(sdf), "table_size", results), "",
            f"From {int(first['n']):,} to {int(last['n']):,} jobs in the table, throughput "
            f"changes by {change:+.0f} % (from {int(before_last['n']):,}: "
            f"{(last['median'] / before_last['median'] - 1) * 100:+.0f} %). "
            + _checkpoint_sentence(sdf, int(last["n"]))
            + "The claim reads the partial index of pickable jobs, so its cost does not depend "
            "on finished rows;",
            "each drained job leaves a dead row version behind (two if its batch was claimed "
            "rather than quick) that autovacuum must clean, which is what the last column "
            "counts.",
        ]
    if (results / "throughput_soak.csv").exists():
        lines += _soak(results)
    if (results / "throughput_work.csv").exists():
        wdf, _ = load("throughput_work", results)
        lines += [
            "", "### Jobs that do something", "",
            plots.markdown(plots.work_table(wdf)), "",
            "`write_row` inserts one row through the handler's session (it commits with the "
            "job); `sleep_10ms` waits 10 ms (I/O).",
            "A lane runs its batch's handlers one after another, so sleeping jobs go as fast "
            "as lanes × 100 jobs/s: concurrency, not batching, is the knob for them.",
        ]
    return "\n".join(lines)


def _checkpoint_sentence(sdf: pd.DataFrame, n: int) -> str:
    """What the biggest drain costs the server that the smaller ones do not."""
    if "checkpoints" not in sdf:
        return ""
    big = sdf[sdf["n"] == n]
    smaller = sdf[sdf["n"] < n]
    if big["checkpoints"].median() < 1 or smaller["checkpoints"].max() > 0:
        return ""
    images = big["full_page_images"].median()
    return (f"Draining {n:,} jobs writes {big['wal_mib'].median():,.0f} MiB of WAL (median), "
            "more than `max_wal_size` (1 GB by default) lets pass between checkpoints: a "
            f"checkpoint falls inside it, and the pages touched after it are logged whole "
            f"({images:,.0f} full-page images); no smaller drain spans a checkpoint. ")


def _soak(results: Path) -> list[str]:
    summary, _ = load("throughput_soak", results)
    timeline, _ = load("throughput_soak_timeline", results)
    row = summary.iloc[0]
    climbing = row["dead_peak_last"] > 1.5 * max(row["dead_peak_middle"], 1)
    return [
        "", "### A long run: does the table stay healthy?", "",
        f"{row['rate']:,.0f} jobs/s arriving for {row['seconds']:,.0f} s on one worker at its "
        f"defaults, completed jobs kept {row['keep_seconds']:,.0f} s (then pruned); the jobs "
        "table's rows and size, sampled every second.", "",
        plots.markdown(plots.soak_table(summary), floatfmt=",.1f"), "",
        _figure(plots.soak_plot(timeline), "soak", results), "",
        f"Dead row versions peak at {row['dead_peak_middle']:,.0f} in the run's second third "
        f"and {row['dead_peak_last']:,.0f} in its last: "
        + ("still climbing at the end." if climbing else "a saw-tooth, not a climb.")
        + " Pruning deletes in bursts (every minute, or every tick while a full slice of "
        "10,000 is waiting) and autovacuum (at 2 % dead rows, looked at every 10 s: "
        "`autovacuum_naptime`) takes them back; the table stops growing once pruning "
        f"keeps pace ({row['table_mib_end']:,.1f} MiB at the end) and the worker's memory "
        f"stays where it started ({row['rss_mib_start']:,.0f} → {row['rss_mib_end']:,.0f} MiB).",
    ]


def _modes_sentence(s: pd.DataFrame) -> str:
    """What extra processes bring in each mode, at batch 100 (or the largest)."""
    batch = 100 if (s["batch_size"] == 100).any() else int(s["batch_size"].max())
    at = s[s["batch_size"] == batch].set_index(["mode", "workers"])["median"]
    parts = []
    for mode in ("exclusive", "shared"):
        counts = sorted(w for m, w in at.index if m == mode)
        if len(counts) > 1 and (mode, 1) in at.index:
            ratios = ", ".join(f"{w}: {at[(mode, w)] / at[(mode, 1)]:.2f}×" for w in counts[1:])
            parts.append(f"{mode} mode, against one process ({ratios})")
    if not parts:
        return ""
    return (f"At batch {batch}, extra processes give {'; '.join(parts)}: in exclusive mode "
            "they only stand by, in shared mode they split the work until they outnumber "
            "the cores the server also needs.")


def _latency(results: Path) -> str:
    df, _ = load("latency", results)
    samples, _ = load("latency_samples", results)
    table = plots.latency_table(df)
    low = table.iloc[0]
    high = table.iloc[-1]
    return "\n".join([
        "## Latency", "",
        "Jobs arrive one at a time, each in its own transaction, at a fixed rate that does not "
        "wait for the queue (open loop); one idle worker, woken by LISTEN/NOTIFY. "
        "Enqueue = the row's insertion; start and completion as the worker recorded them.", "",
        plots.markdown(table, ",.1f"), "",
        _figure(plots.latency_plot(df), "latency", results), "",
        _figure(plots.latency_histogram(samples), "latency_histogram", results), "",
        f"At {low['arrivals (jobs/s)']:,.0f} jobs/s a job is complete "
        f"{low['to completion p50 (ms)']:.1f} ms after it was enqueued at the median and "
        f"{low['to completion p99 (ms)']:.1f} ms at p99: the wake-up is a notification, not "
        "a poll.",
        f"At {high['arrivals (jobs/s)']:,.0f} jobs/s the p99 is "
        f"{high['to completion p99 (ms)']:.1f} ms: batches form by themselves as jobs arrive "
        "faster than one commit, trading a little latency for throughput"
        + (f"; the single Python producer reached only {high['achieved']:,.0f} jobs/s, so "
           "that row is the producer's limit, not the queue's."
           if high["achieved"] < 0.9 * high["arrivals (jobs/s)"] else "."),
    ])


def _recovery(results: Path) -> str:
    times, _ = load("recovery", results)
    timeline, _ = load("recovery_timeline", results)
    findings = plots.recovery_findings(times)
    return "\n".join([
        "## Dead-worker recovery", "",
        "The active worker is killed (SIGKILL) or frozen (SIGSTOP) while it works through a "
        "stream of jobs; both workers run "
        f"`jobqueue worker {plots.recovery_common_flags(times, 'argv')}` plus the setup's own "
        "flags. Recovery is the time from the signal to the first job the standby completes, "
        "on the database's clock.", "",
        plots.markdown(plots.recovery_table(times), ",.3f"), "",
        _figure(plots.recovery_timeline_plot(timeline, times), "recovery_timeline", results), "",
        _figure(plots.recovery_times_plot(times), "recovery_times", results), "",
        *[findings[k] for k in ("crash", "hang", "rescue", "left_processing") if findings[k]],
    ])


#: The comparison's drain results, one file per workload (what the jobs do).
COMPARISON_DRAINS = (("comparison_drain", "noop"), ("comparison_write_row", "write_row"),
                     ("comparison_process_payment", "process_payment"))
#: Setups the findings single out (`peers.preset`'s values).
CLI_DEFAULTS, PERFTEST = "CLI defaults", "perfTest"
#: The Python and Node.js queues jobqueue is measured against (not the course design).
QUEUES = ("pgqueuer", "procrastinate", "graphile-worker")


def _peers(results: Path) -> str:
    """jobqueue beside PgQueuer, Procrastinate, graphile-worker and the
    course's design (`comparison.ipynb`): drains of no-op and of real-work
    jobs, then latency and memory where measured."""
    df, context = load("comparison_drain", results)
    versions = ", ".join(f"{plots.SYSTEM_NAMES[k.removesuffix('_version')]} {v}"
                         for k, v in context.items() if k.endswith("_version"))
    lines = [
        "## Beside its peers: PgQueuer, Procrastinate, graphile-worker and the course's design",
        "",
        f"Same server, one run ({versions or 'peer versions unknown'}). Each system runs as "
        "real worker processes in the configuration its own documentation advises for "
        "throughput, with the same numbers of processes as jobqueue (the configuration of "
        "every setup, and what each system's docs say, are listed under each table). "
        "jobqueue runs as the README starts it, `jobqueue worker --import MODULE`, stopped "
        "with SIGTERM once the jobs are done; every label is read back from the arguments "
        "the processes were given. Besides no-op jobs, two kinds of real work, the same in "
        "every system: `write_row` INSERTs one row; `process_payment` (the seed's handler) "
        "UPDATEs a user's balance and INSERTs the payment in one transaction. Each peer's "
        "task writes through a pool of its own, as its docs show (PgQueuer an asyncpg pool "
        "passed as a shared resource, Procrastinate its connector's pool, graphile-worker "
        "`helpers.query` and `helpers.withPgClient`); jobqueue's handlers write through the "
        "session it hands them, in the batch's transaction. Every drain checks that each job "
        "ran once and wrote exactly its rows. Throughput comes from the timestamps each "
        "system writes on PostgreSQL's clock (claimed: `jobs.started_at`, PgQueuer's "
        "`picked` log row, Procrastinate's `started` event, graphile-worker's `locked_at`; "
        "completion recorded: `jobs.completed_at`, `successful`, `succeeded`; "
        "graphile-worker keeps no record of a completion, so its drain ends at the first "
        "10 ms sample that finds its jobs table empty). The course's design runs in the "
        "benchmark's own process, timed by its client clock.", "",
    ]
    for name, _ in COMPARISON_DRAINS:
        if (results / f"{name}.csv").exists():
            lines += [*_peers_drain(load(name, results)[0], results, name), ""]
    if (results / "comparison_latency.csv").exists():
        lines += [*_peers_latency(results), ""]
    if (results / "comparison_memory.csv").exists():
        lines += _peers_memory(results)
    return "\n".join(lines).rstrip("\n")


def _peers_drain(df: pd.DataFrame, results: Path, name: str) -> list[str]:
    spread = plots.peer_drain_spread(df)
    handler = plots.workload(df)
    rounds = int(spread["runs"].max())
    lines = [
        f"### Draining {plots.usual_n(df):,} {plots.WORKLOADS.get(handler, handler)}", "",
        f"Jobs already queued; median jobs/s of {rounds} round{'s' if rounds > 1 else ''} "
        "(min–max), every setup once per round, one after another. `n` is the number of jobs "
        "each drain ran: the slowest setups drain fewer, so that a run lasts seconds rather "
        "than minutes. Peak RSS is the largest resident memory any of the setup's worker "
        "processes reached.", "",
        plots.markdown(plots.peer_drain_table(df)), "",
        *configuration_notes(df), "",
        _figure(plots.peer_drain_plot(df), name, results), "",
        *drain_findings(df),
        *commit_findings(df),
        shortest_drain(df),
    ]
    return lines


def commit_findings(df: pd.DataFrame) -> list[str]:
    """Where the systems that commit per job land, from the rows (no-op
    drains only: with real work every system's job costs more)."""
    spread = plots.peer_drain_spread(df)
    per_job = spread[spread["system"].isin(["procrastinate", "course design"])]
    if plots.workload(df) != "noop" or per_job.empty:
        return []
    names = " and ".join(dict.fromkeys(
        "the course design" if x == "course design" else plots.SYSTEM_NAMES[x]
        for x in per_job["system"]))
    names = names[0].upper() + names[1:]
    return [f"{names} commit per job (Procrastinate twice: the claim, then the completion) "
            f"and stay between {per_job['median'].min():,.0f} and "
            f"{per_job['median'].max():,.0f} jobs/s: every job waits for a durable commit of "
            "its own. PgQueuer, graphile-worker and jobqueue claim in batches; jobqueue also "
            "records a batch's completions in the same transaction."]


def configuration_notes(df: pd.DataFrame) -> list[str]:
    """Beside a table or figure: for each system in `df`, the setups it ran
    (their labels, read back from the arguments the runs used) and what its
    documentation advises for throughput (`peers.RECOMMENDED`, with the page)."""
    lines = ["Configuration of each system, as run here and as its documentation advises:", ""]
    for system in [s for s in plots.SYSTEM_COLORS if s in set(df["system"])]:
        ran = "; ".join(dict.fromkeys(
            plots.plain_settings(x) for x in df[df["system"] == system]["settings"]))
        advice, links = peers.RECOMMENDED[system]
        pages = ", ".join(f"[{name}]({url})" for name, url in links)
        lines.append(f"- **{plots.SYSTEM_NAMES[system]}**, run as: {ran}. "
                     f"{advice}{f' ({pages})' if pages else ''}")
    return lines


def shortest_drain(df: pd.DataFrame) -> str:
    """The shortest drain behind a table, and which setup ran it."""
    row = df.loc[df["seconds"].idxmin()]
    return (f"The shortest of these drains lasted {row['seconds']:.1f} s "
            f"({plots.SYSTEM_NAMES[row['system']]}, {plots.plain_settings(row['settings'])}, "
            f"n = {int(row['n']):,}).")


def _rate(row: pd.Series, usual: int) -> str:
    n = int(row["n"])
    return f"{row['median']:,.0f} jobs/s" + (f", n = {n:,}" if n != usual else "")


def _setting(row: pd.Series, usual: int) -> str:
    """`batch 500, 2 processes: 6,924 jobs/s`."""
    return f"{plots.plain_settings(row['settings'])}: {_rate(row, usual)}"


def _named(row: pd.Series, usual: int, whose: str = "best") -> str:
    """`PgQueuer's best (batch 500, 2 processes: 6,924 jobs/s)`."""
    system = row["system"]
    owner = ("the course design's" if system == "course design"
             else f"{plots.SYSTEM_NAMES[system]}'s {whose}")
    return f"{owner} ({_setting(row, usual)})"


def _who(row: pd.Series, usual: int) -> str:
    """`PgQueuer (batch 500, 2 processes: 6,924 jobs/s)`."""
    return f"{plots.SYSTEM_NAMES[row['system']]} ({_setting(row, usual)})"


def _best(rows: pd.DataFrame) -> pd.Series | None:
    return None if rows.empty else rows.loc[rows["median"].idxmax()]


#: The order the findings name the other systems in.
_OTHERS = ("pgqueuer", "graphile-worker", "procrastinate", "course design")


def drain_findings(df: pd.DataFrame) -> list[str]:
    """The sentences under a drain comparison, computed from its rows (one
    workload): jobqueue at its CLI defaults against each system's best (and
    graphile-worker's perfTest configuration); jobqueue's best against the
    best queue with the same number of processes; best against best. Rates
    are medians over the rounds; a rate from a different n says its n."""
    s = plots.peer_drain_spread(df)
    usual = plots.usual_n(df)
    ours = s[s["system"] == "jobqueue"]
    queues = s[s["system"].isin(QUEUES)]
    lines = []
    default = _best(ours[ours["preset"] == CLI_DEFAULTS])
    if default is not None:
        parts = []
        for system in _OTHERS:
            best = _best(s[s["system"] == system])
            if best is None:
                continue
            perftest = _best(s[(s["system"] == system) & (s["preset"] == PERFTEST)])
            if perftest is not None and perftest.name != best.name:
                parts.append(f"{default['median'] / perftest['median']:,.1f}× "
                             + _named(perftest, usual, "perfTest configuration"))
            whose = "best" if perftest is None or perftest.name != best.name else (
                "best, its perfTest configuration")
            parts.append(f"{default['median'] / best['median']:,.1f}× "
                         + _named(best, usual, whose))
        if parts:
            lines.append(f"jobqueue at its CLI defaults ({_setting(default, usual)}): "
                         f"{', '.join(parts[:-1])}"
                         f"{' and ' if len(parts) > 1 else ''}{parts[-1]}.")
    same = sorted(set(ours["workers"]) & set(queues["workers"]))
    for k in same:
        mine = _best(ours[ours["workers"] == k])
        theirs = _best(queues[queues["workers"] == k])
        assert mine is not None and theirs is not None
        procs = f"{k} process{'es' if k > 1 else ''}"
        lines.append(f"With {procs}: jobqueue's best ({_setting(mine, usual)}) is "
                     f"{mine['median'] / theirs['median']:,.1f}× the best other queue with "
                     f"{procs}, {_who(theirs, usual)}.")
    if "workers_used_min" in s.columns:
        for _, row in ours[ours["workers_used_min"] < ours["workers"]].iterrows():
            lines.append(f"In at least one round of {plots.plain_settings(row['settings'])}, "
                         f"only {row['workers_used_min']:.0f} of its {row['workers']} processes "
                         "took jobs.")
    mine, theirs = _best(ours), _best(queues)
    if mine is not None and theirs is not None:
        lines.append(f"Best against best, whatever the number of processes: "
                     f"{_who(mine, usual)} against {_who(theirs, usual)}: "
                     f"{mine['median'] / theirs['median']:,.1f}×.")
    return lines


#: The issue's goals: jobqueue at its CLI defaults against a peer's best
#: (among `systems`, or only their `preset` setup), by at least `factor`.
GOALS: Sequence[tuple[str, tuple[str, ...], str, float]] = (
    ("noop", ("pgqueuer",), "", 3.0),
    ("noop", ("graphile-worker",), PERFTEST, 2.0),
    ("write_row", ("pgqueuer", "graphile-worker"), "", 2.0),
    ("process_payment", ("pgqueuer", "graphile-worker"), "", 2.0),
)


def goal_lines(drains: dict[str, pd.DataFrame]) -> list[str]:
    """Each goal of `GOALS` whose workload was measured, with the ratio the
    medians give and whether it is met."""
    lines = []
    for handler, systems, wanted, factor in GOALS:
        if handler not in drains:
            continue
        s = plots.peer_drain_spread(drains[handler])
        usual = plots.usual_n(drains[handler])
        ours = _best(s[(s["system"] == "jobqueue") & (s["preset"] == CLI_DEFAULTS)])
        pool = s[s["system"].isin(systems) & ((s["preset"] == wanted) if wanted else True)]
        theirs = _best(pool)
        names = " and ".join(plots.SYSTEM_NAMES[x] for x in systems)
        against = f"{names}'s {wanted + ' configuration' if wanted else 'best'}"
        if len(systems) > 1:
            against = f"the best of {names}"
        if ours is None or theirs is None:
            lines.append(f"- {handler}: at least {factor:g}× {against}: not measured in this run.")
            continue
        ratio = ours["median"] / theirs["median"]
        lines.append(
            f"- {handler}: at least {factor:g}× {against}: jobqueue at its CLI defaults "
            f"({_rate(ours, usual)}) against {_who(theirs, usual)} is {ratio:,.2f}×: "
            f"{'met' if ratio >= factor else 'not met'}.")
    return lines


def _peers_latency(results: Path) -> list[str]:
    df, _ = load("comparison_latency", results)
    samples, _ = load("comparison_latency_samples", results)
    return [
        "### Latency under open-loop arrivals", "",
        *latency_method(df), "",
        plots.markdown(plots.peer_latency_table(df), ",.1f"), "",
        *configuration_notes(df), "",
        _figure(plots.peer_latency_plot(df), "comparison_latency", results), "",
        _figure(plots.peer_latency_cdf(samples), "comparison_latency_cdf", results), "",
        *latency_findings(df),
    ]


def _count(k: int, what: str) -> str:
    return f"{k:,} {what}{'s' if k != 1 else ''}"


def latency_method(df: pd.DataFrame) -> list[str]:
    """How the latency runs were made, from their rows: the runs per setup,
    the warm-up left out, the seconds counted, the percentile rule."""
    runs = df.groupby(["system", "settings", "rate"])["run"].size()
    counted = ("each setup ran once at each rate" if runs.max() == 1 else
               f"each setup ran {runs.min()}–{runs.max()} times at each rate (medians of "
               "the runs)" if runs.min() != runs.max() else
               f"each setup ran {runs.max()} times at each rate (medians of the runs)")
    warmup = sorted(df["warmup_s"].unique())
    seconds = sorted(df["seconds"].unique())
    return [
        "Jobs enqueued one at a time, each in its own transaction, at a fixed rate that does "
        "not wait for the queue (open loop), by the same asyncpg producer for every system; "
        f"one idle worker per system, woken by its own LISTEN/NOTIFY; {counted}. "
        f"The first {' or '.join(f'{w:g}' for w in warmup)} s of each run's arrivals are "
        f"left out (warm-up); the next {' or '.join(f'{x:g}' for x in seconds)} s are "
        "counted. A percentile is shown only where the run's counted jobs carry it (p99 "
        "from 100 jobs, p99.9 from 1,000; \"–\" otherwise). A rate the producer did not "
        "reach (under 95 % of it) is plotted at the rate achieved, hollow, and flagged in "
        "the table, as is a system that fell behind (completed under 95 % of the arrival "
        "rate): its latency is a backlog that grows with the run, not a wake-up."]


def latency_findings(df: pd.DataFrame) -> list[str]:
    """The sentences under the latency comparison, computed from its rows."""
    med = plots.peer_latency_runs(df)
    low = med[med["rate"] == med["rate"].min()]
    lines = []
    for _, row in low.iterrows():
        name = plots.SYSTEM_NAMES[row["system"]]
        p99 = ("" if pd.isna(row["complete_p99_ms"]) else
               f", p99 {row['complete_p99_ms']:,.1f} ms")
        lines.append(
            f"At {row['rate']:,.0f} jobs/s {name} starts a job {row['start_p50_ms']:,.1f} ms "
            f"after it was enqueued at the median and records its completion "
            f"{row['complete_p50_ms']:,.1f} ms after{p99} ({_count(int(row['jobs']), 'job')} "
            "counted).")
    pgq = low[low["system"] == "pgqueuer"]
    if len(pgq):
        row = pgq.iloc[0]
        lines.append(
            f"PgQueuer's gap between start and recorded completion "
            f"({row['complete_p50_ms'] - row['start_p50_ms']:.0f} ms at the median) is its "
            "completion buffer: PgQueuer 1.6 writes finished jobs when the buffer holds "
            "`batch_size` of them or about every 0.1 s (`JobStatusLogBuffer`, "
            "`pgqueuer/core/buffers.py`), in a statement of their own.")
    for _, row in med.iterrows():
        if not (row["rate_met"] and row["kept_up"]):
            lines.append(f"At {row['rate']:,.0f} jobs/s asked, "
                         f"{plots.SYSTEM_NAMES[row['system']]}: "
                         f"{plots.latency_flag(row)} (completion p50 "
                         f"{row['complete_p50_ms']:,.0f} ms).")
    return lines


def _peers_memory(results: Path) -> list[str]:
    df, _ = load("comparison_memory", results)
    timeline, _ = load("comparison_memory_timeline", results)
    return [
        "### Memory over a long drain", "",
        "One worker drains a large table while its resident memory (VmRSS) is read every "
        "quarter second from outside the process.", "",
        plots.markdown(plots.peer_memory_table(df), ",.2f"), "",
        *configuration_notes(df), "",
        _figure(plots.peer_memory_plot(timeline), "comparison_memory", results), "",
        *memory_findings(df),
    ]


def memory_findings(df: pd.DataFrame) -> list[str]:
    """The sentences under the memory comparison, computed from its rows:
    each worker's memory before and after, per 10,000 jobs so that drains of
    different n compare, and which n differ."""
    lines = []
    for _, row in df.iterrows():
        if pd.isna(row["rss_start_mib"]) or pd.isna(row["rss_end_mib"]):
            continue
        lines.append(
            f"{plots.SYSTEM_NAMES[row['system']]}'s worker held {row['rss_start_mib']:.1f} MiB "
            f"at its first claim and {row['rss_end_mib']:.1f} MiB after {int(row['n']):,} jobs "
            f"({row['rss_end_mib'] - row['rss_start_mib']:+.1f} MiB, "
            f"{row['rss_per_10k_jobs_mib']:+.2f} MiB per 10,000 jobs; peak "
            f"{row['rss_peak_mib']:.1f} MiB).")
    sizes = sorted(set(int(x) for x in df["n"]))
    if len(sizes) > 1:
        fewer = df[df["n"] < max(sizes)]
        lines.append(
            "Not every worker drained the same n: "
            + ", ".join(f"{plots.SYSTEM_NAMES[r['system']]} {int(r['n']):,} "
                        f"({r['seconds']:.0f} s at {r['jobs_per_sec']:,.0f} jobs/s)"
                        for _, r in fewer.iterrows())
            + f" against {max(sizes):,}; compare them by the change per 10,000 jobs.")
    return lines


def _comparison(results: Path) -> str:
    df, _ = load("throughput_matrix", results)
    one = df[(df["mode"] == "exclusive") & (df["workers"] == 1)]
    per_job = plots.spread(one, ["batch_size"], "jobs_per_sec")
    batch1 = per_job[per_job["batch_size"] == per_job["batch_size"].min()]["median"].iloc[0]
    best = per_job["median"].max()
    course_line = []
    if (results / "throughput_course.csv").exists():
        cdf, _ = load("throughput_course", results)
        c = plots.spread(cdf, ["n"], "jobs_per_sec").iloc[0]
        course_line = [
            f"The course's own design (a transaction and ORM round trips per job, reproduced in "
            f"`jobqueue/benchmarks/course.py`) drains {c['median']:,.0f} jobs/s "
            f"({c['min']:,.0f}–{c['max']:,.0f}, {int(c['runs'])} runs of {int(c['n']):,} jobs) "
            "on the same server.", ""]
    return "\n".join([
        "## This vs Celery + Redis (the course's table, redone)", "",
        *course_line,
        "| | jobqueue (measured here) | Celery + Redis |",
        "|---|---|---|",
        "| Setup | PostgreSQL only | PostgreSQL for the data, plus Redis and Celery workers |",
        f"| Throughput, one worker | {batch1:,.0f} jobs/s committing every job; {best:,.0f} "
        "jobs/s with batches | not measured here (no Celery run on this machine yet); the "
        "course's 500–1,000/s is unsourced |",
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


def commit_cost_us(results: Path) -> float | None:
    """What a durable commit costs on this machine, from the ceiling table: an
    INSERT committed on its own minus the same INSERT in an open transaction
    (None without the table)."""
    if not (results / "ceiling.csv").exists():
        return None
    rows = load("ceiling", results)[0].set_index("name")["wall_us"]
    if not {"INSERT + COMMIT", "INSERT"} <= set(rows.index):
        return None
    return float(rows["INSERT + COMMIT"] - rows["INSERT"])


def _limits(results: Path) -> str:
    frames = [load(path.stem, results)[0] for path in sorted(results.glob("*.csv"))]
    most = max((int(f["workers"].dropna().max()) for f in frames
                if "workers" in f.columns and f["workers"].notna().any()), default=1)
    commit = commit_cost_us(results)
    commit_line = ("- Durable settings (fsync and synchronous_commit on) on a virtual disk: "
                   + (f"a commit costs about {commit:,.0f} µs here (the ceiling table: an INSERT "
                      "committed on its own, minus the INSERT), which bounds every "
                      "per-job-commit figure." if commit is not None else
                      "every per-job-commit figure is bounded by the cost of a commit."))
    return "\n".join([
        "## Known limits of these figures", "",
        "- One 2-core machine runs the server, the workers and the producer: they compete "
        "for CPU, so the figures are lower than on a real database host; the most worker "
        f"processes any setup of this run used is {most}.",
        commit_line,
        "- The producer of the latency runs is one Python process; at the highest rates its "
        "own lag is reported in the results file (`producer_late_p99_ms`).",
    ])


def _ceiling(results: Path) -> str:
    df, context = load("ceiling", results)
    rows = df.set_index("name")
    table = pd.DataFrame({
        "per job": df["name"], "what it is": df["what"],
        "wall µs": df["wall_us"], "client CPU µs": df["client_cpu_us"],
        "server CPU µs": df["server_cpu_us"],
        "jobs/s": df["jobs_per_sec"].round().astype(int)})
    lines = [
        "## Where a job's time goes", "",
        f"`python -m jobqueue.benchmarks.ceiling --save`: each row repeats one thing "
        f"{int(df['n'].min()):,} times on one connection (the queue-statement rows: "
        f"{int(df['n'].max()):,} no-op jobs), median of {int(df['repeat'].iloc[0])} runs; "
        f"event loop: {context.get('event_loop', '?')}; written "
        f"{context.get('written', '?')}.", "",
        plots.markdown(table, floatfmt=",.1f"), ""]
    before, after = "session per job (create_savepoint)", "lane session, plain"
    if before in rows.index and after in rows.index and "INSERT" in rows.index:
        old, new = rows.loc[before, "wall_us"], rows.loc[after, "wall_us"]
        bare = rows.loc["INSERT", "wall_us"]
        lines.append(
            f"The same INSERT costs {old:,.0f} µs through a session per job and "
            f"{new:,.0f} µs through the lane's session ({old / new:,.1f}× less); "
            f"PostgreSQL's part, the bare statement, is {bare:,.0f} µs: the rest is the "
            "client's (SQLAlchemy's statement path and the event loop).")
    return "\n".join(lines)


SECTIONS: Sequence[tuple[str, Callable[[Path], str]]] = (
    ("throughput_matrix", _throughput),
    ("latency", _latency),
    ("recovery", _recovery),
    ("comparison_drain", _peers),
    ("ceiling", _ceiling),
)


def _run_record(results: Path) -> dict[str, Any]:
    """`run.json`, which the bench driver writes: the last full run and the
    partial reruns since ({} when the results came some other way)."""
    try:
        return json.loads((results / "run.json").read_text())  # type: ignore[no-any-return]
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


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
    for rerun in record.get("reruns", []):
        line += (f" **Partial rerun** started {rerun['started']} at commit `{rerun['commit']}`: "
                 f"{', '.join(rerun['notebooks'])} (marked in its sections).")
    return line + " Do not edit by hand: rerun `make bench` on your machine to get your own."


def stamp(results: Path, name: str, record: dict[str, Any]) -> str:
    """Which run a section's results files come from: the full run of the
    header, or, marked as such, another one (a partial rerun, or a notebook
    run by hand)."""
    prefix = name.split("_")[0]
    runs: dict[tuple[str, str], list[str]] = {}
    for path in sorted(results.glob(f"{prefix}*.csv")):
        _, context = load(path.stem, results)
        runs.setdefault((context.get("run", "?"), context.get("commit", "?")), []).append(
            path.name)
    if list(runs) == [(record.get("started"), record.get("commit"))]:
        return (f"*From the run above (started {record['started']}, commit "
                f"`{record['commit']}`).*")
    parts = [f"run {run} at commit `{commit}` ({', '.join(files)})"
             for (run, commit), files in runs.items()]
    return "**Not from the run above**: " + "; ".join(parts) + "."


def render(results: Path = RESULTS, target: Path = CHECKOUT / "BENCHMARKS.md") -> Path:
    """Write `target` (BENCHMARKS.md) and the PNGs, beside the results files."""
    available = [(name, fn) for name, fn in SECTIONS if (results / f"{name}.csv").exists()]
    if not available:
        raise FileNotFoundError(f"no results in {results}: run `make bench` first")
    _, context = load(available[0][0], results)
    record = _run_record(results)
    body = ["# jobqueue — benchmarks", _header(results, record, context), _setup(context)]
    for name, fn in available:
        title, _, rest = fn(results).partition("\n")
        body.append(f"{title}\n\n{stamp(results, name, record)}\n{rest}")
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
    # notebook importing the findings keeps its inline figures.
    matplotlib.use("Agg")
    print(f"wrote {render(args.results, args.output)}")


if __name__ == "__main__":
    main()
