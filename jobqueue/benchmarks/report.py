"""Render BENCHMARKS.md and its plots from the results files:
`python -m jobqueue.benchmarks.report` (the last step of `make bench`).

Every number in the document is read from `notebooks/benchmarks/results/*.csv`;
the sentences that comment on them are computed from the same numbers.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import pandas as pd

from jobqueue.benchmarks import context as results_context
from jobqueue.benchmarks import headline, load, peers, plots, pressure_report, run_record
from jobqueue.benchmarks.headline import COMPARISON_DRAINS

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
    kept = plots.counted(df)
    sized = kept["n"].nunique() > 1
    size = (f"each drain sized from the rate the one before it measured, so that it lasts "
            f"{plots.MIN_DRAIN_SECONDS:g} s or more (the jobs per drain are in the table; a "
            "shorter one is run again bigger, and flagged if it still is)" if sized else
            f"{int(kept['n'].iloc[0]):,} jobs per drain")
    lines = [
        "## Throughput", "",
        f"Draining no-op jobs already in the table, {size}; median jobs/s of "
        f"{int(kept.groupby(['mode', 'workers', 'batch_size']).size().max())} runs (min–max), "
        "timed from the first claim to the last completion. *workers used* is how many worker "
        "processes took jobs in the runs (in exclusive mode one works and the others stand by; "
        "in shared mode all should); *last joined* is how long after the first claim the last "
        "of them made its own first one, the time in which fewer workers drained.", "",
        plots.markdown(plots.throughput_table(df)), "",
        _figure(plots.throughput_plot(df), "throughput", results), "",
        *throughput_findings(df),
    ]
    if (results / "throughput_table_size.csv").exists():
        sdf, _ = load("throughput_table_size", results)
        lines += ["", "### Does cost grow with the table?", "",
                  plots.markdown(plots.table_size_table(sdf)), "",
                  _figure(plots.table_size_plot(sdf), "table_size", results), "",
                  " ".join(table_size_findings(sdf))]
    if (results / "throughput_soak.csv").exists():
        lines += _soak(results)
    if (results / "throughput_work.csv").exists():
        wdf, _ = load("throughput_work", results)
        lines += ["", "### Jobs that do something", "",
                  plots.markdown(plots.work_table(wdf)), "",
                  *work_findings(wdf, df)]
    if (results / "throughput_routing.csv").exists():
        lines += _routing(results)
    if (results / "throughput_sync.csv").exists():
        lines += _sync(results)
    return "\n".join(lines)


def _sync(results: Path) -> list[str]:
    sdf, _ = load("throughput_sync", results)
    return ["", "### Sync handlers beside async ones", "",
            "The same work done by an async handler and by a sync (plain `def`) one, which "
            "the worker runs in threads, each drained by one worker process at the CLI's "
            "defaults.", "",
            plots.markdown(plots.sync_table(sdf)), "", *sync_findings(sdf)]


def sync_findings(sdf: pd.DataFrame) -> list[str]:
    """The sentences under the sync comparison, computed from its medians:
    each work's sync drain against its async one, and what the work adds to
    a sync job."""
    s = plots.sync_summary(sdf).set_index(["work", "kind"])
    lines = []
    for work in dict.fromkeys(s.index.get_level_values("work")):
        if (work, "async") not in s.index or (work, "sync") not in s.index:
            continue
        a, y = s.loc[(work, "async")], s.loc[(work, "sync")]
        cost = (1 / y["median"] - 1 / a["median"]) * 1e6
        lines.append(
            f"`{y['handler']}` ({work}, sync) drains {y['median']:,.0f} jobs/s "
            f"({y['min']:,.0f}–{y['max']:,.0f}) in {int(y['threads'])} threads, "
            f"`{a['handler']}` (async) {a['median']:,.0f} {_worker(a['settings'])}: "
            f"{a['median'] / y['median']:,.1f}× fewer, {cost:,.0f} µs more per job.")
    if ("no-op", "sync") in s.index and ("one INSERT", "sync") in s.index:
        bare, row = s.loc[("no-op", "sync"), "median"], s.loc[("one INSERT", "sync"), "median"]
        lines.append(
            f"The INSERT adds {(1 / row - 1 / bare) * 1e6:,.0f} µs to a sync job "
            f"({bare:,.0f} against {row:,.0f} jobs/s): a sync job's cost is its two commits "
            "(the claim, then its writes with its outcome), a thread hand-off and a sync "
            "session of its own, where async jobs in a quick batch share one commit among "
            "hundreds. Sync handlers are for code that blocks; work that can await is "
            "cheaper as an async handler.")
    return lines


def _routing(results: Path) -> list[str]:
    rdf, _ = load("throughput_routing", results)
    spans, _ = load("throughput_routing_spans", results)
    return ["", "### Queues and priorities", "",
            "The same no-op jobs in one queue at one priority, then spread evenly over "
            "several queues and priorities (interleaved in the table, so that none comes "
            "first), drained by one worker process; *completed after a lower priority* counts "
            "the jobs that completed after a job of lower priority in their own queue had "
            "(jobs committed together count as at once).", "",
            plots.markdown(plots.routing_table(rdf)), "",
            _figure(plots.routing_plot(spans, rdf), "routing", results), "",
            *routing_findings(rdf)]


def routing_findings(rdf: pd.DataFrame) -> list[str]:
    """The sentences under the queues-and-priorities drains, computed from
    them: each spread setup against the one queue at one priority (the first
    setup), and whether priority held within each queue."""
    s = plots.routing_summary(rdf)
    base = s.iloc[0]
    lines = []
    for _, row in s.iloc[1:].iterrows():
        ratio = row["median"] / base["median"]
        verdict = ("within the run-to-run spread" if not _apart(row, base)
                   else "faster" if ratio > 1 else "slower")
        lines.append(
            f"Spread over {int(row['queues'])} queues × {int(row['priorities'])} priorities "
            f"({row['priority_range']}), {int(row['n_max']):,} no-op jobs drain at "
            f"{row['median']:,.0f} jobs/s ({row['min']:,.0f}–{row['max']:,.0f}, "
            f"{_count(int(row['runs']), 'run')}) {_worker(row['settings'])}: {ratio:.2f}× the "
            f"{base['median']:,.0f} of the same jobs in one queue at one priority "
            f"({verdict}). " + _order_sentence(row))
    return lines


def _worker(settings: str) -> str:
    """`at the CLI's defaults (2 lanes, …)` or `with `--queues …` (10 lanes, …)`."""
    flags, _, rest = plots.short_settings(settings).partition(": ")
    return (f"at the CLI's defaults ({rest})" if flags == "CLI defaults"
            else f"with `{flags}` ({rest})")


def _order_sentence(row: pd.Series) -> str:
    """Did each queue finish its higher priorities first?"""
    runs = int(row["runs"])
    if row["late_max"] == 0:
        return (f"Within every queue, no job completed after one of lower priority "
                f"({f'in any of the {runs} runs' if runs > 1 else 'in its one run'}): "
                "higher priorities first.")
    shared = "--queues" not in str(row["argv"])
    return (f"Within their queues, {row['late_median']:,.0f} of {int(row['n_max']):,} jobs "
            f"({row['late_median'] / row['n_max']:.1%}, median of {_count(runs, 'run')}; at most "
            f"{row['late_max']:,.0f}) completed after a job of lower priority in the same queue "
            f"had, by at most {row['late_by_max_s'] * 1000:,.0f} ms"
            + (": priority orders each claim, highest first, but every lane serves every "
               "queue, so two lanes can hold batches of one queue at once, and the one with "
               "the lower priorities may commit first." if shared else "."))


def _drain_setting(row: pd.Series) -> str:
    """`shared mode, 2 workers, batch 1,000`."""
    return (f"{row['mode']} mode, {int(row['workers'])} worker{'s' if row['workers'] > 1 else ''}"
            f", batch {int(row['batch_size']):,}")


def _apart(a: pd.Series, b: pd.Series) -> bool:
    """True when two settings' min–max ranges do not overlap: a difference
    beyond the run-to-run spread."""
    return bool(a["min"] > b["max"] or b["min"] > a["max"])


def throughput_findings(df: pd.DataFrame) -> list[str]:
    """The sentences under the throughput table, computed from its drains:
    what the batch size does, the fastest unflagged setting, what extra
    processes do in each mode, and which settings are flagged."""
    s = plots.drain_summary(df, ["mode", "workers", "batch_size"])
    lines = []
    one = s[(s["mode"] == "exclusive") & (s["workers"] == 1)].set_index("batch_size")
    if len(one) > 1:
        lo, hi = one["median"].idxmin(), one["median"].idxmax()
        lines.append(
            f"One exclusive worker drains {one.loc[hi, 'median'] / one.loc[lo, 'median']:,.0f}× "
            f"as fast at batch {int(hi):,} ({one.loc[hi, 'median']:,.0f} jobs/s) as at batch "
            f"{int(lo):,} ({one.loc[lo, 'median']:,.0f}): a durable commit is paid once per "
            "batch instead of once per job.")
    best = plots.best_setting(df)
    if best is None:
        lines.append("Every setting is flagged, so none is named the best.")
    else:
        faster = s[(s["median"] > best["median"]) & (s["short"] | s["partial"])]
        lines.append(
            f"The fastest setting whose drains all lasted {plots.MIN_DRAIN_SECONDS:g} s or more "
            f"and in which every worker the mode puts to work took jobs in every run: "
            f"{_drain_setting(best)}, {best['median']:,.0f} jobs/s ({best['min']:,.0f}–"
            f"{best['max']:,.0f}, {int(best['runs'])} runs, {int(best['used_min'])} of "
            f"{int(best['workers'])} worker{'s' if best['workers'] > 1 else ''} taking jobs)"
            + ("; higher medians came only from flagged settings ("
               + ", ".join(f"{_drain_setting(r)}: {r['median']:,.0f}" for _, r in faster.iterrows())
               + ")." if len(faster) else "."))
    lines += [x for x in (_modes_sentence(s),) if x]
    flagged = s[s["short"] | s["partial"]]
    if flagged.empty:
        lines.append(f"No setting is flagged: every counted drain lasted "
                     f"{plots.MIN_DRAIN_SECONDS:g} s or more, and in every shared run every "
                     "worker took jobs.")
    else:
        lines.append("Flagged: " + "; ".join(f"{_drain_setting(r)} ({plots._flags(r)})"
                                              for _, r in flagged.iterrows()) + ".")
    return lines


def _modes_sentence(s: pd.DataFrame) -> str:
    """What extra processes bring in each mode, batch size by batch size,
    against one process of the same mode; whether the difference is beyond
    the run-to-run spread (the min–max ranges do not overlap); and how many
    processes took jobs."""
    parts = []
    for mode in ("exclusive", "shared"):
        at = s[s["mode"] == mode].set_index(["workers", "batch_size"])
        for w in sorted({w for w, _ in at.index if w > 1}):
            cells = []
            for batch in sorted(b for ww, b in at.index if ww == w):
                if (1, batch) not in at.index:
                    continue
                many, single = at.loc[(w, batch)], at.loc[(1, batch)]
                ratio = many["median"] / single["median"]
                verdict = ("within the spread" if not _apart(many, single)
                           else "faster" if ratio > 1 else "slower")
                cells.append(f"{ratio:.2f}× at batch {int(batch):,} ({verdict})")
            if not cells:
                continue
            rows = at.xs(w, level="workers")
            low, high = int(rows["used_min"].min()), int(rows["used_max"].max())
            used = ("one process took every job in every run" if high == 1 else
                    f"all {w} processes took jobs in every run" if low == w else
                    f"{low}–{high} of the {w} processes took jobs")
            parts.append(f"{mode} mode, {w} processes against one: {', '.join(cells)}; "
                         f"{used}")
    if not parts:
        return ""
    return ("Extra processes, median against median (\"within the spread\": the min–max "
            "ranges overlap): " + "; ".join(parts) + ".")


def table_size_findings(sdf: pd.DataFrame) -> list[str]:
    """The sentences under the table-size drains, computed from them."""
    ss = plots.drain_summary(sdf, ["n"])
    first, last = ss.iloc[0], ss.iloc[-1]
    change = (last["median"] / first["median"] - 1) * 100
    apart = _apart(first, last)
    lines = [f"From {int(first['n']):,} to {int(last['n']):,} jobs in the table, the median "
             f"throughput changes by {change:+.0f} % ("
             + ("beyond the run-to-run spread: the min–max ranges do not overlap)."
                if apart else "within the run-to-run spread: the min–max ranges overlap).")]
    if not apart:
        lines.append("The claim reads the partial index of pickable jobs, so finished rows do "
                     "not slow it down.")
    checkpoint = _checkpoint_sentence(sdf, int(last["n"]))
    if checkpoint:
        lines.append(checkpoint.strip())
    kept = plots.counted(sdf)
    quiet = kept[kept["autovacuums"] == 0] if "autovacuums" in kept else kept
    if len(quiet):
        per_job = (quiet["dead_tuples"] / quiet["n"]).median()
        lines.append(
            f"*dead tuples after* is the jobs table's `n_dead_tup` when the drain ended (the "
            "statistics can lag a second behind): in the drains autovacuum did not run "
            f"during, {per_job:.2f} per job drained, the row version each completion left "
            "for autovacuum to clean.")
    if "autovacuums" in kept and (kept["autovacuums"] > 0).any():
        ran = kept[kept["autovacuums"] > 0]
        lines.append(f"Autovacuum ran during {len(ran)} of {len(kept)} drains (of "
                     + ", ".join(f"{n:,}" for n in sorted(set(ran["n"])))
                     + " jobs), which leaves fewer dead tuples behind.")
    return lines


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
            "and a checkpoint falls inside it: the pages touched after it are logged whole "
            f"({images:,.0f} full-page images); no smaller drain spans a checkpoint. ")


def work_findings(wdf: pd.DataFrame, matrix: pd.DataFrame | None = None) -> list[str]:
    """The sentences under the jobs that do something, computed from their
    drains and, for `write_row`, the no-op drains of the same setting in
    `matrix` (the throughput matrix), when it has them."""
    w = plots.drain_summary(wdf, ["handler", "mode", "workers", "batch_size"])
    noop = (plots.drain_summary(matrix, ["mode", "workers", "batch_size"])
            .set_index(["mode", "workers", "batch_size"]) if matrix is not None else None)
    lanes_each = int(wdf["concurrency"].max()) if "concurrency" in wdf else 1
    lines = []
    for _, row in w[w["handler"] == "write_row"].iterrows():
        key = (row["mode"], row["workers"], row["batch_size"])
        if noop is None or key not in noop.index:
            continue
        base = noop.loc[key, "median"]
        cost = (1 / row["median"] - 1 / base) * 1e6
        lines.append(
            f"`write_row` ({_drain_setting(row)}) drains {row['median']:,.0f} jobs/s against "
            f"{base:,.0f} for no-op jobs at the same setting: the one INSERT, through the "
            f"handler's session, makes the drain {base / row['median']:,.1f}× slower "
            f"({cost:,.0f} µs more per job).")
    for _, row in w[w["handler"].str.startswith("sleep")].iterrows():
        lanes = int(row["workers"]) * lanes_each
        bound = lanes * 100
        lines.append(
            f"`{row['handler']}` ({_drain_setting(row)}, {lanes_each} lane"
            f"{'s' if lanes_each > 1 else ''} per worker) drains "
            f"{row['median']:,.0f} jobs/s, {row['median'] / bound:.0%} of the {bound:,} jobs/s "
            f"that {lanes} lane{'s' if lanes > 1 else ''} running 10 ms jobs one after another "
            "allow: for waiting jobs, lanes (`--concurrency`) and processes are the knob, not "
            "the batch size.")
    return lines


def course_findings(cdf: pd.DataFrame, matrix: pd.DataFrame) -> list[str]:
    """The course's design against one exclusive jobqueue worker committing
    every job (batch 1) and at its largest batch, from the same run."""
    c = plots.spread(cdf, ["n"], "jobs_per_sec").iloc[0]
    s = plots.drain_summary(matrix, ["mode", "workers", "batch_size"])
    one = s[(s["mode"] == "exclusive") & (s["workers"] == 1)].set_index("batch_size")["median"]
    if one.empty:
        return []
    lo, hi = one.index.min(), one.index.max()
    return [f"The course's design drains {c['median']:,.0f} jobs/s ({c['min']:,.0f}–"
            f"{c['max']:,.0f}, {int(c['runs'])} runs of {int(c['n']):,} jobs); one exclusive "
            f"jobqueue worker {one[lo]:,.0f} at batch {int(lo):,} "
            f"({one[lo] / c['median']:,.1f}×) and {one[hi]:,.0f} at batch {int(hi):,} "
            f"({one[hi] / c['median']:,.0f}×): a transaction per job pays a durable commit and "
            "several round trips for every job, a batch pays them once."]


def _soak(results: Path) -> list[str]:
    summary, _ = load("throughput_soak", results)
    timeline, _ = load("throughput_soak_timeline", results)
    row = summary.iloc[0]
    return [
        "", "### A long run: does the table stay healthy?", "",
        f"{row['rate']:,.0f} jobs/s arriving for {row['seconds']:,.0f} s on one worker at its "
        f"defaults, completed jobs kept {row['keep_seconds']:,.0f} s (then pruned); the jobs "
        "table's rows and size, sampled every second.", "",
        plots.markdown(plots.soak_table(summary), floatfmt=",.1f"), "",
        _figure(plots.soak_plot(timeline), "soak", results), "",
        " ".join(soak_findings(row)),
    ]


def _climbing(later: float, earlier: float) -> bool:
    """A peak in the last third more than half again the second third's."""
    return bool(later > 1.5 * max(earlier, 1))


def soak_findings(row: pd.Series) -> list[str]:
    """The sentences under the long run, from its summary row."""
    dead = _climbing(row["dead_peak_last"], row["dead_peak_middle"])
    lines = [
        f"Dead row versions peak at {row['dead_peak_middle']:,.0f} in the run's second third "
        f"and {row['dead_peak_last']:,.0f} in its last: "
        + ("still climbing at the end." if dead else "a saw-tooth, not a climb."),
        "Pruning deletes in bursts (every minute, or every tick while a full slice of 10,000 "
        "is waiting) and autovacuum (at 2 % dead rows, looked at every 10 s: "
        f"`autovacuum_naptime`) takes them back: {row['autovacuums']:,.0f} autovacuum runs.",
    ]
    if "table_mib_middle" in row and not pd.isna(row["table_mib_middle"]):
        grew = _climbing(row["table_mib_end"], row["table_mib_middle"])
        lines.append(f"The table is {row['table_mib_middle']:,.1f} MiB at the end of the second "
                     f"third and {row['table_mib_end']:,.1f} MiB at the end"
                     + (": still growing." if grew else ": it stopped growing."))
    start, end = row["rss_mib_start"], row["rss_mib_end"]
    if not (pd.isna(start) or pd.isna(end)):
        lines.append(f"The worker's resident memory goes from {start:,.0f} to {end:,.0f} MiB"
                     + (" (within 10 %)." if abs(end - start) <= 0.1 * start else "."))
    return lines


def _latency(results: Path) -> str:
    df, _ = load("latency", results)
    samples, _ = load("latency_samples", results)
    return "\n".join([
        "## Latency", "",
        "Jobs arrive one at a time, each in its own transaction, at a fixed rate that does not "
        "wait for the queue (open loop); one idle worker, woken by LISTEN/NOTIFY. "
        "Enqueue = the row's insertion; start and completion as the worker recorded them.", "",
        plots.markdown(plots.latency_table(df, samples), ",.1f"), "",
        _figure(plots.latency_plot(df, samples), "latency", results), "",
        _figure(plots.latency_histogram(samples), "latency_histogram", results), "",
        *latency_findings(df, samples),
    ])


def latency_findings(df: pd.DataFrame, samples: pd.DataFrame) -> list[str]:
    """The sentences under the latency table, computed from it: how the
    samples were counted, the lowest rate, the batches that form as the rate
    grows, and the rates the producer did not reach."""
    from jobqueue.worker import WorkerConfig

    st = plots.latency_stats(df, samples)
    warm = float(st["warmup_s"].max())
    lines = [
        (f"The first {warm:g} s of every run is left out as warm-up "
         f"({int(samples['warmup'].sum()):,} jobs in all: the worker's first jobs pay for cold "
         "connections and caches). " if warm > 0 and "warmup" in samples else "")
        + f"Each quantile pools the samples of the {int(st['runs'].max())} runs at a rate and "
        "is shown only where they can carry it: a q-quantile needs 1/(1 − q) samples "
        f"(p99: {plots.min_samples(0.99):,}, p99.9: {plots.min_samples(0.999):,}); "
        "\"–\" where there are fewer."]
    low = st.iloc[0]
    if low["samples"] == 0:
        return [*lines, f"At {low['rate']:,.0f} jobs/s no job arrived after the warm-up."]
    poll = WorkerConfig().poll_interval
    p99 = low["complete_p99_ms"]
    lines.append(
        f"At {low['rate']:,.0f} jobs/s a job is complete {low['complete_p50_ms']:.1f} ms after "
        "it was enqueued at the median"
        + (f" and {p99:.1f} ms at p99" if not pd.isna(p99) else
           f" ({int(low['samples'])} samples: too few for a p99)")
        + (f", against the worker's {poll:g} s poll interval: the notification wakes it."
           if low["complete_p50_ms"] < poll * 1000 / 10 else "."))
    met = st[st["met"]]
    if "jobs_per_commit" in st and len(met) > 1:
        a, b = met.iloc[0], met.iloc[-1]
        grows = b["jobs_per_commit"] > 1.2 * a["jobs_per_commit"]
        lines.append(
            f"Jobs per commit (jobs that share a completion time): {a['jobs_per_commit']:.1f} at "
            f"{a['rate']:,.0f} jobs/s, {b['jobs_per_commit']:.1f} at {b['rate']:,.0f}"
            + (f": batches form by themselves as jobs arrive faster than one commit, and the "
               f"p99 goes from {_ms(a['complete_p99_ms'])} to {_ms(b['complete_p99_ms'])} ms."
               if grows else "."))
    unmet = st[~st["met"]]
    if len(unmet):
        lines.append(
            "The single Python producer did not reach "
            + ", ".join(f"{r['rate']:,.0f} jobs/s (it kept {r['achieved']:,.0f})"
                        for _, r in unmet.iterrows())
            + f": under {plots.MET_SHARE:.0%} of the target, flagged in the table and drawn "
            "hollow at the rate achieved; those rows measure the producer's limit, not the "
            "queue's.")
    return lines


def _ms(v: float) -> str:
    return "–" if pd.isna(v) else f"{v:.1f}"


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
        *(_failover(results) if (results / "recovery_failover.csv").exists() else []),
    ])


def _failover(results: Path) -> list[str]:
    times, _ = load("recovery_failover", results)
    timeline, _ = load("recovery_failover_timeline", results)
    return [
        "", "### PostgreSQL failover", "",
        "A primary and its synchronous standby (embedded, on this machine); one worker, "
        f"`jobqueue worker {times['argv'].iloc[0]}`, with a DATABASE_URL naming both "
        "(`target_session_attrs=read-write`), works through a stream of "
        f"{int(times['jobs'].iloc[0]):,} jobs of {times['job_ms'].iloc[0]:g} ms; the primary's "
        "postmaster gets SIGKILL and the standby is promoted at once. Times on the servers' "
        "clock; the lost server is rebuilt as the standby between trials.", "",
        plots.markdown(plots.failover_table(times), ",.3f"), "",
        _figure(plots.failover_timeline_plot(timeline, times), "recovery_failover_timeline",
                results), "",
        plots.failover_findings(times),
    ]


def _peers(results: Path) -> str:
    """jobqueue beside PgQueuer, Procrastinate, oban-py, graphile-worker and
    the course's design (`comparison.ipynb`): drains of no-op and of real-work
    jobs, then latency and memory where measured."""
    df, context = load("comparison_drain", results)
    versions = ", ".join(f"{plots.SYSTEM_NAMES[k.removesuffix('_version')]} {v}"
                         for k, v in context.items() if k.endswith("_version"))
    lines = [
        "## Beside its peers: PgQueuer, Procrastinate, oban-py, graphile-worker and the "
        "course's design",
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
        "passed as a shared resource, Procrastinate its connector's pool, oban-py a psycopg "
        "pool of the tasks' own, graphile-worker "
        "`helpers.query` and `helpers.withPgClient`); jobqueue's handlers write through the "
        "session it hands them, in the batch's transaction. Every drain checks that each job "
        "ran once and wrote exactly its rows. Throughput comes from the timestamps each "
        "system writes on PostgreSQL's clock (claimed: `jobs.started_at`, PgQueuer's "
        "`picked` log row, Procrastinate's `started` event, oban-py's `attempted_at`, "
        "graphile-worker's `locked_at`; completion recorded: `jobs.completed_at`, "
        "`successful`, `succeeded`, `completed_at`; "
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
        *([PER_JOB_COMMITS] if plots.workload(df) == "noop" else []),
    ]
    return lines


#: Under the no-op drains: why two systems sit orders of magnitude below the others.
PER_JOB_COMMITS = (
    "Procrastinate and the course design commit per job (Procrastinate twice: the claim, "
    "then the completion): every job waits for a durable commit of its own. PgQueuer, "
    "oban-py, graphile-worker and jobqueue claim in batches; jobqueue also records a "
    "batch's completions in the same transaction.")


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
        PGQUEUER_BUFFER,
    ]


#: Under the latency comparison: the gap between PgQueuer's start and its
#: recorded completion, which the table shows and its code explains.
PGQUEUER_BUFFER = (
    "PgQueuer's gap between a job's start and its recorded completion is its completion "
    "buffer: PgQueuer 1.6 writes finished jobs when the buffer holds `batch_size` of them or "
    "about every 0.1 s (`JobStatusLogBuffer`, `pgqueuer/core/buffers.py`), in a statement of "
    "their own.")


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


def _peers_memory(results: Path) -> list[str]:
    df, _ = load("comparison_memory", results)
    timeline, _ = load("comparison_memory_timeline", results)
    return [
        "### Memory over a long drain", "",
        "One worker drains a large table while its resident memory (VmRSS) is read every "
        "quarter second from outside the process.", "",
        plots.markdown(plots.peer_memory_table(df), ",.2f"), "",
        *configuration_notes(df), "",
        _figure(plots.peer_memory_plot(timeline), "comparison_memory", results),
    ]


def _comparison(results: Path) -> str:
    df, _ = load("throughput_matrix", results)
    df = plots.counted(df)
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
    frames = [pd.read_csv(path, comment="#", usecols=lambda column: column == "workers")
              for path in sorted(results.glob("*.csv"))]  # that column only
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
        *pressure_report.limits(results),
    ])


def _names(systems: Iterable[str]) -> str:
    """`jobqueue, PgQueuer and Procrastinate`: the systems a results file holds."""
    names = [plots.SYSTEM_NAMES[x] for x in dict.fromkeys(systems)]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _pressure(results: Path) -> str:
    """The queues while vacuum is held back (`pressure.ipynb`)."""
    df, context = load("pressure", results)
    timeline, _ = load("pressure_timeline", results)
    lines = [
        "## Under pressure: vacuum held back", "",
        "A session that keeps a transaction open pins the xmin horizon: from then on vacuum can "
        "remove no row version that died after it began, and every finished job's dead "
        "versions stay in the queue's tables and indexes for each claim to step over. "
        f"{_names(df['system'])} go through the same phases in one run.", "",
        *pressure_report.method(df, context), "",
        plots.markdown(pressure_report.table(df), ",.1f"), "",
        *configuration_notes(df), "",
        _figure(pressure_report.plot(timeline, df), "pressure", results), "",
        "\n\n".join(pressure_report.findings(df, timeline)), "",
        "The issue's goal for jobqueue, against this run:", "",
        *pressure_report.goal_lines(df, timeline)]
    probes = pressure_report.probe_table(df)
    if not probes.empty:
        lines += ["", "jobqueue's claim at the end of each phase (EXPLAIN (ANALYZE, BUFFERS) "
                  "of `take`, as a lane sends it, in a transaction rolled back):", "",
                  plots.markdown(probes)]
    return "\n".join(lines)


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
    ("pressure", _pressure),
    ("ceiling", _ceiling),
)


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
    """The notebook parameters a run set from the environment (its size
    differs from the notebooks' full size there)."""
    if not overrides:
        return ""
    return (" It set, over the notebooks' full size: "
            + ", ".join(f"`{key}={value}`" for key, value in sorted(overrides.items())) + ".")


def stamp(results: Path, name: str, record: dict[str, Any], cpu: str | None = None) -> str:
    """Which run a section's results files come from: the full run of the
    header, or, marked as such, another one (a partial rerun, or a notebook
    run by hand), with its machine when it is not `cpu`, the Setup's: a
    rerun on another machine is not comparable figure by figure."""
    prefix = name.split("_")[0]
    runs: dict[tuple[str, str, str], list[str]] = {}
    for path in sorted(results.glob(f"{prefix}*.csv")):
        stamp_of = results_context(path.stem, results)
        runs.setdefault((stamp_of.get("run", "?"), stamp_of.get("commit", "?"),
                         stamp_of.get("cpu", "?")), []).append(path.name)
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
    glance = headline.markdown(results)
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
    # notebook importing the findings keeps its inline figures.
    matplotlib.use("Agg")
    print(f"wrote {render(args.results, args.output)}")


if __name__ == "__main__":
    main()
