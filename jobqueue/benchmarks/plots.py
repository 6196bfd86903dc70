"""Tables and figures from results files: the notebooks show them, the report
saves them as PNGs for BENCHMARKS.md. Each takes the DataFrame `load()` gives."""

from __future__ import annotations

import math
import re
import shlex
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import ScalarFormatter

from jobqueue.benchmarks.scenarios import MIN_DRAIN_SECONDS

RATE = "jobs/s"


def spread(df: pd.DataFrame, by: list[str], value: str) -> pd.DataFrame:
    """Median, min and max of `value` over repetitions, per group."""
    grouped = df.groupby(by, sort=True)[value]
    out = grouped.agg(["median", "min", "max", "count"]).reset_index()
    return out.rename(columns={"count": "runs"})


def markdown(df: pd.DataFrame, floatfmt: str = ",.0f") -> str:
    """A DataFrame as a Markdown table (numbers formatted, no index)."""
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return format(v, floatfmt)
        if isinstance(v, int):
            return format(v, ",")
        return str(v)

    header = "| " + " | ".join(str(c) for c in df.columns) + " |"
    rule = "|" + "|".join("---:" if pd.api.types.is_numeric_dtype(df[c]) else "---"
                          for c in df.columns) + "|"
    rows = ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([header, rule, *rows])


def _range(row: pd.Series) -> str:
    return f"{row['median']:,.0f} ({row['min']:,.0f}–{row['max']:,.0f})"


# -- throughput -----------------------------------------------------------------

#: How a drain row is flagged wherever it is shown.
SHORT_FLAG = f"drain under {MIN_DRAIN_SECONDS:g} s"
PARTIAL_FLAG = "not every worker took part"
#: A shared drain whose last worker joined later than this share of the
#: drain is flagged: for that long, fewer workers drained than it says.
LATE_SHARE = 0.1
LATE_FLAG = f"a worker joined after {LATE_SHARE:.0%} of the drain"


def counted(df: pd.DataFrame) -> pd.DataFrame:
    """The drains the figures use: without the sizing runs `drain_matrix`
    ran again bigger (results written before sizing kept every row)."""
    return df[df["counted"].astype(bool)] if "counted" in df.columns else df


def _expected_workers(df: pd.DataFrame) -> pd.Series:
    """Workers that should take jobs: all of them in shared mode, the
    active one in exclusive mode (the others stand by)."""
    return df["workers"].where(df["mode"] == "shared", 1)


def drain_summary(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Per setting: median, min and max jobs/s of the counted drains, how
    long they lasted and how many jobs each drained, the workers that took
    jobs, and the flags: `short` (some drain lasted under MIN_DRAIN_SECONDS),
    `partial` (in some run fewer workers took jobs than the mode puts to
    work, all W in shared mode, or the last of them joined after LATE_SHARE
    of the drain)."""
    df = counted(df).assign(expected=lambda d: _expected_workers(d))
    s = spread(df, by, "jobs_per_sec")
    g = df.groupby(by, sort=True)
    extra = pd.DataFrame({
        "seconds_min": g["seconds"].min(), "seconds_max": g["seconds"].max(),
        "n_min": g["n"].min(), "n_max": g["n"].max(),
        "used_min": g["workers_used"].min(), "used_max": g["workers_used"].max(),
        "short_runs": g["seconds"].apply(lambda v: int((v < MIN_DRAIN_SECONDS).sum())),
        "partial_runs": df.assign(p=df["workers_used"] < df["expected"]).groupby(
            by, sort=True)["p"].sum().astype(int),
        "expected": g["expected"].first()}).reset_index()
    skew = df["start_skew_s"] if "start_skew_s" in df else pd.Series(0.0, index=df.index)
    late = df.assign(skew=skew, late=skew > LATE_SHARE * df["seconds"]).groupby(by, sort=True)
    extra = extra.merge(pd.DataFrame({"skew_max": late["skew"].max(),
                                      "late_runs": late["late"].sum().astype(int)}
                                     ).reset_index(), on=by)
    s = s.merge(extra, on=by)
    s["short"] = s["short_runs"] > 0
    s["partial"] = (s["partial_runs"] > 0) | (s["late_runs"] > 0)
    return s


def _span(low: float, high: float, fmt: str = ",.0f") -> str:
    return format(low, fmt) if low == high else f"{low:{fmt}}–{high:{fmt}}"


def _flags(row: pd.Series) -> str:
    flags = []
    if row["short"]:
        flags.append(f"⚠ {SHORT_FLAG} ({row['short_runs']} of {row['runs']})")
    if row["partial_runs"]:
        flags.append(f"⚠ {PARTIAL_FLAG} ({row['partial_runs']} of {row['runs']} runs)")
    if row["late_runs"]:
        flags.append(f"⚠ {LATE_FLAG} ({row['late_runs']} of {row['runs']} runs)")
    return "; ".join(flags)


def _drain_columns(s: pd.DataFrame) -> pd.DataFrame:
    """The columns every drain table shows after its setting's."""
    return pd.DataFrame({
        f"{RATE}, median (min–max)": s.apply(_range, axis=1),
        "drain s (min–max)": [_span(a, b, ".2f") for a, b in
                              zip(s["seconds_min"], s["seconds_max"], strict=True)],
        "jobs per drain": [_span(a, b) for a, b in zip(s["n_min"], s["n_max"], strict=True)],
        "workers used": [_span(a, b, "d") for a, b in
                         zip(s["used_min"].astype(int), s["used_max"].astype(int), strict=True)],
        "last joined (s)": s["skew_max"].map(lambda v: f"{v:.2f}"),
        "runs": s["runs"], "flags": s.apply(_flags, axis=1)})


def throughput_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per mode × worker count × batch size: median jobs/s (min–max)
    over the counted drains, their length, their size, the workers that
    took jobs (`workers_used`), and the flags."""
    s = drain_summary(df, ["mode", "workers", "batch_size"])
    head = pd.DataFrame({"mode": s["mode"], "workers": s["workers"],
                         "batch size": s["batch_size"]})
    return pd.concat([head, _drain_columns(s)], axis=1)


def best_setting(df: pd.DataFrame) -> pd.Series | None:
    """The setting with the highest median among those that carry no flag
    (every drain long enough, every worker the mode puts to work took jobs
    in every run); None if every setting is flagged."""
    s = drain_summary(df, ["mode", "workers", "batch_size"])
    clean = s[~s["short"] & ~s["partial"]]
    return None if clean.empty else clean.loc[clean["median"].idxmax()]


def _mark_flagged(ax: Any, s: pd.DataFrame, x: str) -> None:
    flagged = s[s["short"] | s["partial"]]
    if len(flagged):
        ax.plot(flagged[x], flagged["median"], "o", markersize=13, markerfacecolor="none",
                markeredgecolor="red", label="flagged (see the table)")


def throughput_plot(df: pd.DataFrame) -> plt.Figure:
    s = drain_summary(df, ["mode", "workers", "batch_size"])
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for (mode, workers), g in s.groupby(["mode", "workers"]):
        ax.errorbar(g["batch_size"], g["median"],
                    yerr=[g["median"] - g["min"], g["max"] - g["median"]],
                    marker="o" if mode == "shared" else "s", capsize=3,
                    linestyle="-" if mode == "shared" else "--",
                    label=f"{mode}, {workers} worker{'s' if workers > 1 else ''}")
    _mark_flagged(ax, s, "batch_size")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("batch size (jobs per transaction)")
    ax.set_ylabel(f"drain throughput ({RATE}, median, min–max)")
    ax.set_title(f"Draining {WORKLOADS.get(workload(df), workload(df))}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def table_size_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per table size: jobs/s, the drain's length, and what the drain left
    and cost the server: `n_dead_tup` when it ended, autovacuum runs during
    it, WAL, full-page images and checkpoints (medians over the runs)."""
    s = drain_summary(df, ["n"])
    medians = counted(df).groupby("n").median(numeric_only=True).reset_index(drop=True)
    table = pd.DataFrame({"jobs in table": s["n"]})
    cols = _drain_columns(s).drop(columns=["jobs per drain", "workers used", "last joined (s)"])
    table = pd.concat([table, cols.drop(columns=["runs", "flags"])], axis=1)
    table["dead tuples after"] = medians["dead_tuples"]
    if "autovacuums" in medians:  # results written before these columns existed lack them
        table["autovacuums during"] = medians["autovacuums"]
    if "wal_mib" in medians:
        table["WAL MiB"] = medians["wal_mib"].round(0)
        table["full-page images"] = medians["full_page_images"]
        table["checkpoints"] = medians["checkpoints"]
    table["runs"] = cols["runs"]
    table["flags"] = cols["flags"]
    return table


def table_size_plot(df: pd.DataFrame) -> plt.Figure:
    s = drain_summary(df, ["n"])
    fig, ax = plt.subplots(figsize=(6, 3.8))
    ax.errorbar(s["n"], s["median"], yerr=[s["median"] - s["min"], s["max"] - s["median"]],
                marker="o", capsize=3)
    _mark_flagged(ax, s, "n")
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("jobs in the table at the start")
    ax.set_ylabel(f"drain throughput ({RATE})")
    ax.set_title("Does cost grow with the table?")
    ax.grid(True, which="both", alpha=0.3)
    if s["short"].any() or s["partial"].any():
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def soak_table(summary: pd.DataFrame) -> pd.DataFrame:
    """The long run in one row: peaks in its second and last thirds."""
    cols = {"rate": "jobs/s", "seconds": "seconds", "keep_seconds": "kept (s)",
            "dead_peak_middle": "dead rows, peak (2nd third)",
            "dead_peak_last": "dead rows, peak (last third)",
            "live_peak_last": "live rows, peak (last third)",
            "table_mib_end": "table MiB at the end", "autovacuums": "autovacuums",
            "rss_mib_start": "worker RSS MiB, start", "rss_mib_end": "worker RSS MiB, end"}
    return summary[list(cols)].rename(columns=cols)


def soak_plot(timeline: pd.DataFrame) -> plt.Figure:
    fig, (rows, size, memory) = plt.subplots(1, 3, figsize=(13, 3.6))
    rows.plot(timeline["t"], timeline["live"], label="live rows")
    rows.plot(timeline["t"], timeline["dead"], label="dead rows")
    rows.plot(timeline["t"], timeline["backlog"], label="waiting jobs")
    rows.set_title("jobs table: rows")
    rows.legend()
    size.plot(timeline["t"], timeline["table_mib"], label="table")
    size.plot(timeline["t"], timeline["pickable_index_mib"], label="idx_jobs_pickable")
    size.set_title("on disk (MiB)")
    size.legend()
    memory.plot(timeline["t"], timeline["rss_mib"], color="C3")
    memory.set_ylim(bottom=0)
    memory.set_title("worker resident memory (MiB)")
    for ax in (rows, size, memory):
        ax.set_xlabel("seconds into the run")
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def work_table(df: pd.DataFrame) -> pd.DataFrame:
    """Jobs that do something, per handler × mode × worker count × batch size."""
    s = drain_summary(df, ["handler", "mode", "workers", "batch_size"])
    head = s[["handler", "mode", "workers", "batch_size"]].rename(
        columns={"batch_size": "batch size"})
    return pd.concat([head, _drain_columns(s)], axis=1)


_SYNC = ["setup_order", "work", "kind", "handler"]


def sync_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per handler of the sync comparison, in the order they ran
    (`scenarios.sync_series`): `drain_summary`'s figures, and the worker's
    label and threads."""
    s = drain_summary(df, _SYNC)
    g = counted(df).groupby(_SYNC, sort=True)
    extra = pd.DataFrame({"settings": g["settings"].first(),
                          "threads": g["threads"].first()}).reset_index()
    return s.merge(extra, on=_SYNC)


def sync_table(df: pd.DataFrame) -> pd.DataFrame:
    """A row per handler: its work, async or sync, jobs/s and the drains."""
    s = sync_summary(df)
    head = pd.DataFrame({"work": s["work"], "handler": s["kind"] + " (`" + s["handler"] + "`)"})
    cols = _drain_columns(s).drop(columns=["workers used", "last joined (s)"])
    return pd.concat([head, cols], axis=1)


# -- queues and priorities --------------------------------------------------------

_ROUTING = ["setup_order", "setup"]


def routing_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per routing setup, in the order they ran (`scenarios.routing_series`):
    `drain_summary`'s figures, the setup's queues, priorities and worker
    label, and how priority held within the queues: the median of each
    run's jobs completed after a job of lower priority in their queue
    (`late_median`), the most in any run, and the most by which one was late
    (`late_by_max_s`)."""
    s = drain_summary(df, _ROUTING)
    g = counted(df).groupby(_ROUTING, sort=True)
    extra = pd.DataFrame({"queues": g["queues"].first(), "priorities": g["priorities"].first(),
                          "priority_range": g["priority_range"].first(),
                          "settings": g["settings"].first(), "argv": g["argv"].first(),
                          "late_median": g["late_jobs"].median(), "late_max": g["late_jobs"].max(),
                          "late_by_max_s": g["late_by_s"].max()}).reset_index()
    return s.merge(extra, on=_ROUTING)


def routing_table(df: pd.DataFrame) -> pd.DataFrame:
    """A row per routing setup: queues × priorities, the worker, jobs/s,
    the drains, and the jobs that completed after a lower priority of
    their own queue (median of the runs and its share of n; the most late
    any was, in ms)."""
    s = routing_summary(df)
    head = pd.DataFrame({"setup": s["setup"], "priorities": s["priority_range"],
                         "worker": s["settings"].map(short_settings)})
    cols = _drain_columns(s).drop(columns=["workers used", "last joined (s)"])
    late = pd.DataFrame({
        "completed after a lower priority (median)": [
            f"{m:,.0f} ({m / n:.1%})" for m, n in zip(s["late_median"], s["n_max"], strict=True)],
        "late by at most (ms)": (s["late_by_max_s"] * 1000).map(lambda v: f"{v:,.1f}")})
    return pd.concat([head, cols.drop(columns=["runs", "flags"]), late,
                      cols[["runs", "flags"]]], axis=1)


def routing_plot(spans: pd.DataFrame, df: pd.DataFrame) -> plt.Figure:
    """A panel per setup with more than one priority, from its last run: a
    line per queue and priority from its first completed job to its last,
    seconds from the drain's first claim. Priorities that held draw each
    queue's lines left to right from the highest priority down."""
    s = routing_summary(df)
    shown = s[s["priorities"] > 1]
    fig, axes = plt.subplots(1, max(1, len(shown)), figsize=(5.5 * max(1, len(shown)), 3.8),
                             squeeze=False)
    levels = sorted(set(spans["priority"]), reverse=True)
    colors = {p: plt.get_cmap("viridis")(i / max(1, len(levels) - 1))
              for i, p in enumerate(levels)}
    for ax, (_, setup) in zip(axes[0], shown.iterrows(), strict=False):
        mine = spans[spans["setup"] == setup["setup"]]
        last = mine[mine["run"] == mine["run"].max()]
        queues = sorted(set(last["queue"]), key=lambda q: (len(q), q))
        for y, queue in enumerate(queues):
            for _, span in last[last["queue"] == queue].iterrows():
                offset = (levels.index(span["priority"]) - (len(levels) - 1) / 2) * 0.12
                # Ends marked: a priority done in one commit is a point.
                ax.plot([span["first_s"], span["last_s"]], [y + offset] * 2, linewidth=2.5,
                        marker="|", markersize=5, color=colors[span["priority"]],
                        solid_capstyle="butt")
        ax.set_yticks(range(len(queues)), queues, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("seconds from the first claim")
        runs_with = short_settings(setup["settings"]).partition(": ")[2]
        ax.set_title(f"{setup['setup']}\n{runs_with}", fontsize=8)
        ax.grid(True, axis="x", alpha=0.3)
    for p in levels:
        axes[0][0].plot([], [], color=colors[p], linewidth=2.5, label=f"priority {p}")
    axes[0][0].legend(fontsize=7, loc="lower right")
    fig.suptitle("Each queue's jobs by priority, first to last completion (last run)",
                 fontsize=9)
    fig.tight_layout()
    return fig


# -- latency ------------------------------------------------------------------------

#: An arrival rate counts as met when the producer reached this share of it.
MET_SHARE = 0.95
QUANTILE_NAMES = {"p50": 0.5, "p95": 0.95, "p99": 0.99, "p99_9": 0.999}


def min_samples(q: float) -> int:
    """Samples a q-quantile needs before it is more than the largest value
    or an interpolation past it: 1 / (1 - q) (p99: 100, p99.9: 1,000)."""
    return math.ceil(round(1 / (1 - q), 9))


def latency_stats(df: pd.DataFrame, samples: pd.DataFrame) -> pd.DataFrame:
    """Per arrival rate: the rate achieved (median over runs) and whether it
    met the target (MET_SHARE), and each quantile of enqueue → start and
    enqueue → completion over the samples of every run pooled, the warm-up
    left out; NaN where the pooled samples are too few for that quantile
    (`min_samples`)."""
    steady = samples[~samples["warmup"].astype(bool)] if "warmup" in samples else samples
    g = df.groupby("rate")
    out = pd.DataFrame({"achieved": g["achieved_rate"].median(), "runs": g.size(),
                        "warmup_s": g["warmup_s"].max() if "warmup_s" in df else 0.0})
    if "jobs_per_commit" in df:
        out["jobs_per_commit"] = g["jobs_per_commit"].median()
    out["samples"] = steady.groupby("rate").size().reindex(out.index).fillna(0).astype(int)
    out["met"] = out["achieved"] >= MET_SHARE * out.index.to_series()
    for prefix, column in (("start", "to_start_ms"), ("complete", "to_complete_ms")):
        by = steady.groupby("rate")[column]
        for name, q in QUANTILE_NAMES.items():
            values = by.quantile(q).reindex(out.index)
            out[f"{prefix}_{name}_ms"] = values.where(out["samples"] >= min_samples(q))
    return out.reset_index()


def _ms(v: float) -> str:
    return "–" if pd.isna(v) else f"{v:,.1f}"


def latency_table(df: pd.DataFrame, samples: pd.DataFrame) -> pd.DataFrame:
    """`latency_stats` as the notebook and BENCHMARKS.md show it: "–" for a
    quantile the samples cannot carry, ⚠ beside an arrival rate not met."""
    st = latency_stats(df, samples)
    out = pd.DataFrame({
        "arrivals (jobs/s)": st["rate"],
        "achieved (jobs/s)": [f"{a:,.0f}" + ("" if m else f" ⚠ under {MET_SHARE:.0%}")
                              for a, m in zip(st["achieved"], st["met"], strict=True)],
        "runs": st["runs"], "samples (pooled)": st["samples"]})
    if "jobs_per_commit" in st:
        out["jobs per commit"] = st["jobs_per_commit"].map(lambda v: f"{v:,.1f}")
    for label, prefix in (("to start", "start_"), ("to completion", "complete_")):
        for q in QUANTILE_NAMES:
            out[f"{label} {q.replace('_', '.')} (ms)"] = st[f"{prefix}{q}_ms"].map(_ms)
    return out


def latency_plot(df: pd.DataFrame, samples: pd.DataFrame) -> plt.Figure:
    """Enqueue → completion quantiles against the rate achieved (not the
    target); an unmet rate is drawn hollow and labelled with its target."""
    st = latency_stats(df, samples)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for (q, style), color in zip((("p50", "o-"), ("p99", "s-"), ("p99_9", "^-")),
                                 ("C0", "C1", "C2"), strict=True):
        col = f"complete_{q}_ms"
        have = st[st[col].notna()]
        ax.plot(have["achieved"], have[col], style, color=color,
                label=f"{q.replace('_', '.')}")
        unmet = have[~have["met"]]
        ax.plot(unmet["achieved"], unmet[col], style[0], color="white", markeredgecolor=color,
                markersize=8)
    for i, (_, row) in enumerate(st[~st["met"]].iterrows()):
        ax.annotate(f"target {row['rate']:,.0f}", (row["achieved"], row["complete_p50_ms"]),
                    textcoords="offset points", xytext=(4, -12 - 9 * i), fontsize=7)
    if (~st["met"]).any():
        ax.plot([], [], "o", color="white", markeredgecolor="gray",
                label=f"rate not met (achieved < {MET_SHARE:.0%} of target)")
    if ax.has_data():
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
    else:
        ax.text(0.5, 0.5, "no samples after the warm-up", ha="center", transform=ax.transAxes)
    ax.set_xlabel("arrival rate achieved (jobs/s, open loop)")
    ax.set_ylabel("enqueue → completion (ms)")
    warm = float(st["warmup_s"].max())
    ax.set_title("Latency under load" + (f" (first {warm:g} s of each run left out)"
                                         if warm > 0 else ""), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def latency_histogram(samples: pd.DataFrame) -> plt.Figure:
    """The distribution per arrival rate, the warm-up left out."""
    steady = samples[~samples["warmup"].astype(bool)] if "warmup" in samples else samples
    fig, ax = plt.subplots(figsize=(6.5, 4))
    positive = steady[steady["to_complete_ms"] > 0]
    low, high = positive["to_complete_ms"].min(), positive["to_complete_ms"].max()
    bins = pd.Series([low * (high / low) ** (i / 60) for i in range(61)]) if high > low else 30
    for rate, g in positive.groupby("rate"):
        ax.hist(g["to_complete_ms"], bins=bins, histtype="step", label=f"{rate:g} jobs/s",
                density=True)
    ax.set_xscale("log")
    ax.set_xlabel("enqueue → completion (ms)")
    ax.set_ylabel("density")
    ax.set_title("Distribution of latency, by arrival rate")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# -- recovery -----------------------------------------------------------------------


#: What tells one recovery setup from another in a results file: the path
#: read from the workers' argv, the flags shown, and how long each job ran.
RECOVERY_KEYS = ["path", "flags", "job_ms"]


def recovery_setups(times: pd.DataFrame) -> list[tuple[tuple[Any, ...], str]]:
    """Each setup of a run (in the order it ran) with its label: the path,
    the job length, and the flags that set it apart from the other setups
    (the flags all share are said once, by `recovery_common_flags`)."""
    keys = list(dict.fromkeys(times[RECOVERY_KEYS].itertuples(index=False, name=None)))
    common = set(_flag_pairs(recovery_common_flags(times)))
    out = []
    for path, flags, job_ms in keys:
        own = [f"{f} {v}".strip() for f, v in _flag_pairs(flags) if (f, v) not in common]
        extra = f", `{' '.join(own)}`" if own else ""
        out.append(((path, flags, job_ms), f"{path}, {job_ms:g} ms jobs{extra}"))
    return out


def recovery_common_flags(times: pd.DataFrame, column: str = "flags") -> str:
    """The flags every setup of a run gave its workers (`column` "argv": with
    the ones tables leave out, `--import` and `--log-level`)."""
    pairs = [_flag_pairs(f) for f in dict.fromkeys(times[column])]
    common = [p for p in pairs[0] if all(p in other for other in pairs[1:])]
    return " ".join(f"{f} {v}".strip() for f, v in common)


def _flag_pairs(flags: str) -> list[tuple[str, str]]:
    words = shlex.split(flags)
    pairs = []
    for i, word in enumerate(words):
        if word.startswith("--"):
            value = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else ""
            pairs.append((word, value))
    return pairs


def _recovery_groups(times: pd.DataFrame) -> list[tuple[str, str, pd.DataFrame]]:
    """(setup label, signal, its trials) in the order they ran."""
    groups = []
    for key, label in recovery_setups(times):
        of_setup = times[(times[RECOVERY_KEYS] == pd.Series(key, index=RECOVERY_KEYS)).all(axis=1)]
        for name in dict.fromkeys(of_setup["signal"]):
            groups.append((label, name, of_setup[of_setup["signal"] == name]))
    return groups


def recovery_table(df: pd.DataFrame) -> pd.DataFrame:
    """A row per setup and signal: recovery times, what the dead worker held
    at the signal, and whether each held job completed exactly once."""
    rows = []
    for label, name, g in _recovery_groups(df):
        done = g["held_done_s"].dropna()
        rows.append({
            "setup": label, "signal": name, "trials": len(g),
            "median (s)": g["seconds"].median(), "min (s)": g["seconds"].min(),
            "max (s)": g["seconds"].max(),
            "first job started, median (s)": g["started_s"].median(),
            "held at the signal": _ints(g["held_processing"]),
            "last held job done, median (s)": f"{done.median():.3f}" if len(done) else "–",
            "held jobs completed once": f"{int(g['held_completed_once'].sum())} of "
                                        f"{int(g['held_processing'].sum())}",
            "jobs not run exactly once": int(g["completed_not_once"].sum())})
    return pd.DataFrame(rows)


def _ints(values: pd.Series) -> str:
    lo, hi = int(values.min()), int(values.max())
    return f"{lo}" if lo == hi else f"{lo}–{hi}"


def _plain(label: str) -> str:
    """A label for a figure: without the Markdown backticks."""
    return label.replace("`", "")


def _median_trial(trials: pd.DataFrame) -> Any:
    return trials.sort_values("seconds").iloc[len(trials) // 2]["trial"]


def recovery_timeline_plot(timeline: pd.DataFrame, times: pd.DataFrame) -> plt.Figure:
    """A row per setup, a column per signal: the trial with the median
    recovery, completions per 100 ms by worker, the signal at t = 0."""
    setups = recovery_setups(times)
    signals = list(dict.fromkeys(times["signal"]))
    fig, axes = plt.subplots(len(setups), len(signals), figsize=(5.2 * len(signals),
                                                                 2.5 * len(setups)),
                             squeeze=False)
    for row, (_, label) in enumerate(setups):
        for col, name in enumerate(signals):
            ax = axes[row, col]
            match = [g for lab, sig, g in _recovery_groups(times) if lab == label and sig == name]
            if not match:
                ax.set_visible(False)
                continue
            trials = match[0]
            setup, trial = trials["setup"].iloc[0], _median_trial(trials)
            g = timeline[(timeline["setup"] == setup) & (timeline["signal"] == name)
                         & (timeline["trial"] == trial)]
            for worker, color in (("first", "tab:blue"), ("second", "tab:orange")):
                w = g[g["worker"] == worker]
                ax.bar(w["t"] + 0.05, w["jobs"], width=0.1, color=color,
                       label=f"{worker} worker ({'active' if worker == 'first' else 'standby'})")
            ax.axvline(0, color="black", linestyle="--", linewidth=1)
            held = int(trials.loc[trials["trial"] == trial, "held_processing"].iloc[0])
            ax.set_title(f"{name}: {_plain(label)}\n(held {held} processing; signal at 0 s)",
                         fontsize=8)
            ax.set_xlabel("seconds from the signal", fontsize=8)
            ax.set_ylabel("jobs per 100 ms", fontsize=8)
            ax.legend(fontsize=7)
    fig.suptitle(f"all workers: {recovery_common_flags(times)}", fontsize=9)
    fig.tight_layout()
    return fig


def recovery_times_plot(times: pd.DataFrame) -> plt.Figure:
    """A panel per signal, a box per setup: every trial's recovery."""
    signals = list(dict.fromkeys(times["signal"]))
    fig, axes = plt.subplots(1, len(signals), figsize=(4.6 * len(signals), 4), squeeze=False)
    for ax, name in zip(axes[0], signals, strict=True):
        groups = [(label, g) for label, sig, g in _recovery_groups(times) if sig == name]
        for x, (_, g) in enumerate(groups, start=1):
            ax.plot([x] * len(g), g["seconds"], "o", alpha=0.6)
        ax.boxplot([g["seconds"] for _, g in groups], widths=0.4)
        ax.set_xticks(range(1, len(groups) + 1),
                      [_plain(label).replace(", ", "\n") for label, _ in groups], fontsize=7)
        ax.set_title(name)
        ax.set_ylabel("signal → standby's first completion (s)")
    fig.suptitle(f"all workers: {recovery_common_flags(times)}", fontsize=9)
    fig.tight_layout()
    return fig


def recovery_findings(times: pd.DataFrame) -> dict[str, str]:
    """What the notebook and BENCHMARKS.md say about the recovery figures,
    every number computed from the trials: "crash", "hang", "rescue" and
    "left_processing" (empty when the run had no such trials)."""
    from jobqueue.worker.config import WorkerConfig

    groups = _recovery_groups(times)

    def each(name: str, digits: int) -> str:
        return "; ".join(f"{label}: {_seconds(g['seconds'], digits)}"
                         for label, sig, g in groups if sig == name)

    out = {"crash": "", "hang": "", "rescue": "", "left_processing": ""}
    crash = times[times["signal"] == "SIGKILL"]
    if len(crash):
        lease = float(crash["lease"].max())
        worst = float(crash["seconds"].max())
        out["crash"] = (
            f"After a crash (SIGKILL) the standby completed its first job, median (range): "
            f"{each('SIGKILL', 3)}. It started that job a median "
            f"{crash['started_s'].median():.3f} s after the signal (all setups, "
            f"{crash['started_s'].min():.3f}–{crash['started_s'].max():.3f} s): that is the "
            "takeover; the rest is its first batch running. The slowest crash was recovered in "
            f"{worst:.3f} s, "
            f"{lease / worst:,.0f}× less than the {lease:g} s lease: the dead worker's "
            "connections close, its advisory locks go with them, and the standby, blocked in "
            "`pg_advisory_lock`, is granted the lock at once.")
    hang = times[times["signal"] == "SIGSTOP"]
    if len(hang):
        lease = float(hang["lease"].iloc[0])
        tick = WorkerConfig(lease=lease).tick
        within = hang["seconds"].between(lease - tick, lease + tick).sum()
        out["hang"] = (
            f"After a hang (SIGSTOP), with a {lease:g} s lease (the default is "
            f"{WorkerConfig().lease:g} s): {each('SIGSTOP', 2)}. {within} of {len(hang)} hang "
            f"trials lie within the lease ± one heartbeat tick ({tick:g} s): the frozen "
            "worker's connections stay open, so nothing happens until its last heartbeat (up to "
            "a tick before the freeze) is older than the lease; the standby, checking once a "
            "tick, then fences it off (terminates its backends) and takes over.")
    claimed = times[times["path"] == "claimed"]
    quick = times[times["path"] != "claimed"]
    if len(claimed):
        out["rescue"] = _rescue_sentence(claimed, quick)
    out["left_processing"] = _left_processing_sentence(claimed, quick)
    return out


def _seconds(values: pd.Series, digits: int) -> str:
    """A median with its range and count: "0.061 s (0.044–0.088 s, 10 trials)"."""
    if len(values) == 1:
        return f"{values.iloc[0]:.{digits}f} s (1 trial)"
    return (f"{values.median():.{digits}f} s ({values.min():.{digits}f}–"
            f"{values.max():.{digits}f} s, {len(values)} trials)")


def _rescue_sentence(claimed: pd.DataFrame, quick: pd.DataFrame) -> str:
    held = int(claimed["held_processing"].sum())
    once = int(claimed["held_completed_once"].sum())
    wrong = int(claimed["completed_not_once"].sum())
    setups = []
    # Labelled as among every setup of the run (the flags that set each apart).
    for key, label in recovery_setups(pd.concat([claimed, quick])):
        g = claimed[(claimed[RECOVERY_KEYS] == pd.Series(key, index=RECOVERY_KEYS)).all(axis=1)]
        if not len(g):
            continue
        done = [f"{g.loc[g['signal'] == name, 'held_done_s'].median():.3f} s after a {what}"
                for name, what in (("SIGKILL", "crash"), ("SIGSTOP", "hang"))
                if (g["signal"] == name).any()]
        setups.append(f"{label.removeprefix('claimed, ')}: {_ints(g['held_processing'])} in "
                      f"each of {len(g)} trials, the last of them completed by the standby a "
                      f"median {' and '.join(done)}")
    text = ("On the claimed path the dead worker held `processing` jobs at every signal (read "
            "from the database while it was frozen). " + "; ".join(setups) + ". ")
    if once == held and wrong == 0:
        text += (f"Each of the {held} held jobs was completed by the standby exactly once (its "
                 "handler writes a row per run, in the job's transaction), and none of the "
                 f"{int(claimed['completed'].sum()):,} jobs completed in these trials ran twice.")
    else:
        text += (f"Only {once} of the {held} held jobs were completed by the standby exactly once, "
                 f"and {wrong} completed jobs did not run exactly once.")
    if len(quick):
        most = int(quick["held_processing"].max())
        text += (" On the quick path the dead worker held "
                 + ("no `processing` job: its batch was locked inside a transaction that died "
                    "with it, so there was nothing to put back." if most == 0 else
                    f"up to {most} `processing` job(s) (a lane claims when jobs run slower "
                    "than the quick threshold)."))
    return text


def _left_processing_sentence(claimed: pd.DataFrame, quick: pd.DataFrame) -> str:
    text = ("`left_processing` counts the dead worker's jobs still `processing` when the "
            "standby completed its first job. ")
    if not len(claimed):
        return text + (f"Only quick-path trials ran here, where the dead worker held "
                       f"{int(quick['held_processing'].max())} at most: a 0 says nothing.")
    left = int(claimed["left_processing"].max())
    if left == 0:
        text += (f"It is 0 in each of the {len(claimed)} claimed-path trials, where the dead "
                 f"worker had held {_ints(claimed['held_processing'])} at the signal: the standby "
                 "puts a dead worker's jobs back as it takes over, before its first job.")
    else:
        text += (f"It is up to {left} in the claimed-path trials, where the dead worker had held "
                 f"{_ints(claimed['held_processing'])} at the signal: some were not yet back in "
                 "the queue when the standby completed its first job.")
    if len(quick):
        most = int(quick["held_processing"].max())
        text += (" On the quick path nothing was `processing` at the signal, so its "
                 f"{int(quick['left_processing'].max())} there shows no rescue." if most == 0 else
                 f" On the quick path the dead worker held up to {most} at the signal and left "
                 f"up to {int(quick['left_processing'].max())}.")
    return text



# -- PostgreSQL failover ----------------------------------------------------------------


def failover_table(df: pd.DataFrame) -> pd.DataFrame:
    """The failover trials in one row: medians (and the range of the time to
    resume), and whether any job was lost or ran twice."""
    resume = df["resume_s"]
    return pd.DataFrame([{
        "trials": len(df), "kill → first job on the new primary, median (s)": resume.median(),
        "min (s)": resume.min(), "max (s)": resume.max(),
        "promotion, median (s)": df["promotion_s"].median(),
        "kill → promoted, median (s)": df["promoted_s"].median(),
        "promoted → first job, median (s)": df["after_promotion_s"].median(),
        "completed before the kill, kept": f"{int(df['kept_before'].sum()):,} of "
                                           f"{int(df['completed_before'].sum()):,}",
        "jobs not run exactly once": int(df["completed_not_once"].sum())}])


def failover_findings(df: pd.DataFrame) -> str:
    """What the notebook and BENCHMARKS.md say about the failover trials,
    every number computed from them."""
    from jobqueue.errors import Backoff

    resume, promotion = df["resume_s"], df["promotion_s"]
    text = (f"From the primary's SIGKILL to the first job completed on the promoted standby: "
            f"{_seconds(resume, 3)}. The promotion itself (`pg_promote` until the standby takes "
            f"writes) took {_seconds(promotion, 3)}; the rest, "
            f"{df['after_promotion_s'].median():.3f} s at the median after the promotion, is the "
            f"worker: its next attempt to reconnect (it backs off from {Backoff().first:g} s), "
            "a new life on the "
            "new primary (the connections, its registration, the rescue) and its first batch. "
            "No failover manager ran here: the standby was promoted the moment the primary "
            "died, so a real one adds its own time to decide.")
    kept, before = int(df["kept_before"].sum()), int(df["completed_before"].sum())
    wrong = int(df["completed_not_once"].sum()) + int(df["ran_twice"].sum())
    total = int(df["completed"].sum())
    states = sorted(map(str, set(df["replication"]))) if "replication" in df else []
    how = ("Replication was synchronous (the primary's view of its standby before every kill)"
           if states == ["sync"] else
           f"Replication, as the primary saw its standby: {', '.join(states) or 'not recorded'}")
    if kept == before and wrong == 0 and total == int(df["jobs"].sum()):
        text += (f" {how}: each of the {before:,} jobs completed before a "
                 "kill was still completed on the new primary, at the same instant (none ran "
                 f"again), and all {total:,} jobs of the trials completed, each run exactly once "
                 "(a row per run, written in the job's transaction).")
    else:
        text += (f" {how}. Of the {before:,} jobs completed before a kill, {kept:,} were still "
                 f"so on the new primary; {total:,} of {int(df['jobs'].sum()):,} jobs completed, "
                 f"and {wrong} did not run exactly once.")
    return text


def failover_timeline_plot(timeline: pd.DataFrame, times: pd.DataFrame) -> plt.Figure:
    """The trial with the median time to resume: jobs completed per 100 ms,
    on the old primary and then on the new one, the kill at 0 s and the end
    of the promotion marked."""
    trial = times.sort_values("resume_s").iloc[len(times) // 2]
    g = timeline[timeline["trial"] == trial["trial"]]
    fig, ax = plt.subplots(figsize=(6.4, 2.8))
    for server, color in (("old primary", "tab:blue"), ("new primary", "tab:orange")):
        s = g[g["server"] == server]
        ax.bar(s["t"] + 0.05, s["jobs"], width=0.1, color=color, label=f"completed on the {server}")
    ax.axvline(0, color="black", linestyle="--", linewidth=1, label="SIGKILL of the primary")
    ax.axvline(trial["promoted_s"], color="tab:green", linestyle=":", linewidth=1.5,
               label=f"standby promoted ({trial['promoted_s']:.3f} s)")
    ax.set_xlabel("seconds from the kill", fontsize=8)
    ax.set_ylabel("jobs per 100 ms", fontsize=8)
    ax.set_title(f"Failover, median trial: first job on the new primary after "
                 f"{trial['resume_s']:.3f} s", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig

# -- beside the peers -----------------------------------------------------------------

#: One colour per system in every comparison figure.
SYSTEM_COLORS = {"jobqueue": "tab:blue", "pgqueuer": "tab:orange",
                 "procrastinate": "tab:green", "oban-py": "tab:brown",
                 "graphile-worker": "tab:purple",
                 "course design": "tab:gray"}
SYSTEM_NAMES = {"jobqueue": "jobqueue", "pgqueuer": "PgQueuer",
                "procrastinate": "Procrastinate", "oban-py": "oban-py",
                "graphile-worker": "graphile-worker",
                "course design": "course design"}
#: What each drain's jobs do, as headings and titles say it.
WORKLOADS = {"noop": "no-op jobs",
             "write_row": "jobs that INSERT one row (write_row)",
             "process_payment": "process_payment jobs (a balance UPDATE and a payment INSERT)"}
_SETUP = ["system", "settings", "workers", "n"]


def _system_order(df: pd.DataFrame) -> list[str]:
    return [s for s in SYSTEM_COLORS if s in set(df["system"])]


def workload(df: pd.DataFrame) -> str:
    """The drains' handler (`noop` for results written before the column existed)."""
    return str(df["handler"].iloc[0]) if "handler" in df.columns else "noop"


def usual_n(df: pd.DataFrame) -> int:
    """The n most setups drained (the one headings name; others are said)."""
    return int(df["n"].mode().max())


def peer_drain_spread(df: pd.DataFrame) -> pd.DataFrame:
    """Median, min and max jobs/s per setup (system, settings, processes, n),
    with its `preset` and the largest resident memory any worker process
    reached (where it was sampled), in the order the setups ran."""
    df = df.assign(preset=df["preset"].fillna("") if "preset" in df.columns else "")
    s = spread(df, _SETUP, "jobs_per_sec")
    extra = df.groupby(_SETUP).agg(preset=("preset", "first"), seconds=("seconds", "median"))
    if "rss_peak_mib" in df.columns:
        extra["rss_peak_mib"] = df.groupby(_SETUP)["rss_peak_mib"].max()
    if "workers_used" in df.columns:
        extra["workers_used_min"] = df.groupby(_SETUP)["workers_used"].min()
    s = s.merge(extra.reset_index(), on=_SETUP, how="left")
    keys = list(zip(*(df[c] for c in _SETUP), strict=True))
    order = {key: i for i, key in enumerate(dict.fromkeys(keys))}
    s["order"] = [order[k] for k in zip(*(s[c] for c in _SETUP), strict=True)]
    return s.sort_values("order").drop(columns="order").reset_index(drop=True)


def peer_drain_table(df: pd.DataFrame) -> pd.DataFrame:
    """Drain throughput of every setup: processes, jobs drained, median jobs/s
    (min–max over the rounds), how long its drains lasted (flagged under
    `MIN_DRAIN_SECONDS`, too short to be a measurement) and the peak RSS."""
    s = peer_drain_spread(df)
    table = pd.DataFrame({"system": s["system"].map(SYSTEM_NAMES), "settings": s["settings"],
                          "processes": s["workers"], "n": s["n"],
                          f"{RATE} (min–max)": s.apply(_range, axis=1), "runs": s["runs"],
                          "drain (s, median)": s["seconds"].map(
                              lambda v: f"{v:.1f}" + (" (short)" if v < MIN_DRAIN_SECONDS
                                                      else ""))})
    if "workers_used_min" in s.columns:  # recorded by jobqueue's drains (its jobs' worker_id)
        table["fewest processes that took jobs"] = s["workers_used_min"].map(
            lambda v: "–" if pd.isna(v) else f"{v:.0f}")
    if "rss_peak_mib" in s.columns:
        table["peak RSS (MiB)"] = s["rss_peak_mib"].map(
            lambda v: "–" if pd.isna(v) else f"{v:.0f}")
    return table


def peer_best_table(df: pd.DataFrame) -> pd.DataFrame:
    """Each system at its best measured setting (highest median), and how
    many times faster jobqueue's best drained than that."""
    s = peer_drain_spread(df)
    best = s.loc[s.groupby("system")["median"].idxmax()].copy()
    best["o"] = best["system"].map(list(SYSTEM_COLORS).index)
    best = best.sort_values("o").reset_index(drop=True)
    ours = best[best["system"] == "jobqueue"]["median"]
    return pd.DataFrame({"system": best["system"].map(SYSTEM_NAMES),
                         "best setting": best["settings"], "processes": best["workers"],
                         "n": best["n"], f"{RATE} (median)": best["median"].round(0),
                         "jobqueue's best ÷ this": (ours.iloc[0] / best["median"]).round(2)
                         if len(ours) else float("nan")})


_JOBQUEUE_LABEL = re.compile(
    r"^(?:CLI defaults, as in the README )?\(`jobqueue worker (?P<argv>[^`]*)`"
    r"(?P<times> × \d+)?\): (?P<rest>.*)$")


def short_settings(settings: str) -> str:
    """A jobqueue label without its command line, for a figure's axis
    (`scenarios.worker_label`'s `(`jobqueue worker --import m --shared` × 2): …`
    → `--shared × 2: …`; no flag but `--import`: `CLI defaults: …`). Other
    systems' labels are short already."""
    match = _JOBQUEUE_LABEL.match(settings)
    if match is None:
        return settings
    words = shlex.split(match["argv"])
    flags = [w for i, w in enumerate(words)
             if w != "--import" and (i == 0 or words[i - 1] != "--import")]
    return f"{shlex.join(flags) or 'CLI defaults'}{match['times'] or ''}: {match['rest']}"


def plain_settings(settings: str) -> str:
    """A jobqueue label as a sentence quotes it: the command line and what it
    runs with, without the "CLI defaults, as in the README" the sentence says
    itself (`jobqueue worker --import m` × 2: 2 lanes each, …). Other systems'
    labels unchanged."""
    match = _JOBQUEUE_LABEL.match(settings)
    if match is None:
        return settings
    return f"`jobqueue worker {match['argv']}`{match['times'] or ''}: {match['rest']}"


def peer_drain_plot(df: pd.DataFrame) -> plt.Figure:
    """A bar per setup (median jobs/s, min–max whiskers), log scale: the
    systems span two orders of magnitude."""
    s = peer_drain_spread(df).iloc[::-1].reset_index(drop=True)
    usual = usual_n(df)
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(s) + 1.3))
    labels = [f"{SYSTEM_NAMES[a]}: {short_settings(b)}" + (f" (n = {n:,})" if n != usual else "")
              for a, b, n in zip(s["system"], s["settings"], s["n"], strict=True)]
    ax.barh(range(len(s)), s["median"], color=[SYSTEM_COLORS[x] for x in s["system"]],
            xerr=[s["median"] - s["min"], s["max"] - s["median"]], capsize=3)
    ax.set_yticks(range(len(s)), labels, fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel(f"drain throughput ({RATE}, median of runs, min–max)")
    ax.set_title(f"Draining {usual:,} {WORKLOADS.get(workload(df), workload(df))}, same server",
                 fontsize=10)
    ax.grid(True, axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    return fig


def peer_latency_runs(df: pd.DataFrame) -> pd.DataFrame:
    """Each setup's runs at each rate, their medians: the rate asked for and
    achieved, the jobs counted (after the warm-up), the quantiles (NaN where
    a run's sample does not carry them) and the flags (`rate_met`, `kept_up`:
    false if any run's was)."""
    keys = ["rate", "system", "settings"]
    cols = [c for c in df.columns if c.endswith("_ms") or c in (
        "achieved_rate", "completed_rate", "jobs", "warmup_s")]
    med = df.groupby(keys, sort=False)[cols].median().reset_index()
    flags = df.groupby(keys, sort=False).agg(
        runs=("run", "size"), rate_met=("rate_met", "all"),
        kept_up=("kept_up", "all")).reset_index()
    med = med.merge(flags, on=keys)
    med["o"] = med["system"].map(list(SYSTEM_COLORS).index)
    return med.sort_values(["rate", "o"]).drop(columns="o").reset_index(drop=True)


def latency_flag(row: pd.Series) -> str:
    parts = []
    if not row["rate_met"]:
        parts.append(f"rate not met: {row['achieved_rate']:,.0f} of {row['rate']:,.0f}")
    if not row["kept_up"]:
        parts.append(f"fell behind: completed {row['completed_rate']:,.0f}/s")
    return "; ".join(parts) or "met"


def peer_latency_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per rate and setup: the rate asked for and achieved with its flag, the
    jobs counted, p50, p99 and p99.9 to start and to completion ("–" where
    the sample does not carry that percentile); medians over the runs."""
    med = peer_latency_runs(df)
    table = pd.DataFrame({
        "arrivals asked (jobs/s)": med["rate"], "system": med["system"].map(SYSTEM_NAMES),
        "settings": med["settings"].map(short_settings),
        "achieved (jobs/s)": med["achieved_rate"].round(0),
        "rate": med.apply(latency_flag, axis=1), "runs": med["runs"],
        "jobs counted": med["jobs"].astype(int)})
    for what, prefix in (("start", "start_"), ("completion", "complete_")):
        for q in ("50", "99", "99_9"):
            column = f"{prefix}p{q}_ms"
            if column in med.columns:
                table[f"to {what} p{q.replace('_', '.')} (ms)"] = med[column].map(_ms)
    return table


def peer_latency_plot(df: pd.DataFrame) -> plt.Figure:
    """p50 (circles) and p99 (squares, where carried) against the rate the
    producer achieved, to start and to completion, one colour per system;
    hollow markers flag a run whose asked rate was not met or which fell
    behind."""
    med = peer_latency_runs(df)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, (what, prefix) in zip(axes, (("start", "start_"), ("completion", "complete_")),
                                  strict=True):
        for system in _system_order(med):
            g = med[med["system"] == system]
            color = SYSTEM_COLORS[system]
            for q, marker, style in (("50", "o", "-"), ("99", "s", "--")):
                ax.plot(g["achieved_rate"], g[f"{prefix}p{q}_ms"], style, color=color,
                        label=f"{SYSTEM_NAMES[system]} p{q}")
                ok = g["rate_met"] & g["kept_up"]
                ax.scatter(g["achieved_rate"][ok], g[f"{prefix}p{q}_ms"][ok], marker=marker,
                           color=color)
                ax.scatter(g["achieved_rate"][~ok], g[f"{prefix}p{q}_ms"][~ok], marker=marker,
                           facecolors="none", edgecolors=color)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arrival rate achieved (jobs/s, open loop; hollow: rate not met or "
                      "fell behind)", fontsize=8)
        ax.set_title(f"enqueue → {what}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("milliseconds")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def peer_latency_cdf(samples: pd.DataFrame, rate: float | None = None) -> plt.Figure:
    """Share of the counted jobs completed within x ms of being enqueued, per
    system, at one asked arrival rate (the middle one unless told)."""
    rates = sorted(samples["rate"].unique())
    rate = rate if rate is not None else rates[len(rates) // 2]
    at = samples[samples["rate"] == rate]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for system in _system_order(at):
        values = at[at["system"] == system]["to_complete_ms"].sort_values()
        share = [(i + 1) / len(values) for i in range(len(values))]
        ax.step(values.clip(lower=0.01), share, where="post", color=SYSTEM_COLORS[system],
                label=SYSTEM_NAMES[system])
    ax.set_xscale("log")
    ax.set_xlabel("enqueue → completion recorded (ms)")
    ax.set_ylabel("share of jobs")
    ax.set_title(f"Latency distribution, arrivals asked at {rate:g} jobs/s "
                 "(the table gives the rate achieved)", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def peer_memory_table(df: pd.DataFrame) -> pd.DataFrame:
    """Resident memory of one worker at the start and end of a long drain,
    its peak, and the change per 10,000 jobs (comparable where n differ)."""
    return pd.DataFrame({
        "system": df["system"].map(SYSTEM_NAMES), "settings": df["settings"].map(short_settings),
        "jobs drained": df["n"], f"{RATE}": df["jobs_per_sec"].round(0),
        "RSS at first claim (MiB)": df["rss_start_mib"].round(1),
        "RSS at last completion (MiB)": df["rss_end_mib"].round(1),
        "peak RSS (MiB)": df["rss_peak_mib"].round(1),
        "change per 10,000 jobs (MiB)": df["rss_per_10k_jobs_mib"].round(2)})


def peer_memory_plot(timeline: pd.DataFrame) -> plt.Figure:
    """Each worker's RSS over its drain, against the share of the drain done
    (t / the drain's length; readings inside the drain), so that drains of
    different n share one axis; the legend gives each n."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for system in _system_order(timeline):
        g = timeline[timeline["system"] == system]
        total = float(g["drain_seconds"].iloc[0])
        g = g[(g["t"] >= 0) & (g["t"] <= total)]
        n = int(g["n"].iloc[0]) if len(g) else 0
        ax.plot(100 * g["t"] / total, g["rss_mib"], ".-", color=SYSTEM_COLORS[system],
                label=f"{SYSTEM_NAMES[system]} ({n:,} jobs, "
                      f"{short_settings(str(g['settings'].iloc[0])) if len(g) else ''})")
    ax.set_ylim(bottom=0)
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of the drain done (%, from the first claim to the last completion)")
    ax.set_ylabel("worker resident memory (MiB)")
    ax.set_title("One worker's memory while it drains")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
