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


def recovery_table(df: pd.DataFrame) -> pd.DataFrame:
    s = spread(df, ["signal", "lease"], "seconds")
    return s.rename(columns={"median": "median (s)", "min": "min (s)", "max": "max (s)",
                             "lease": "lease (s)", "runs": "trials"})


def recovery_timeline_plot(timeline: pd.DataFrame, times: pd.DataFrame) -> plt.Figure:
    """For each signal, the trial with the median recovery: completions per
    100 ms by worker, the signal at t = 0."""
    signals = list(dict.fromkeys(times["signal"]))
    fig, axes = plt.subplots(len(signals), 1, figsize=(7, 2.6 * len(signals)), squeeze=False)
    for ax, name in zip(axes[:, 0], signals, strict=True):
        trials = times[times["signal"] == name].sort_values("seconds")
        median_trial = trials.iloc[len(trials) // 2]["trial"]
        g = timeline[(timeline["signal"] == name) & (timeline["trial"] == median_trial)]
        for worker, color in (("first", "tab:blue"), ("second", "tab:orange")):
            w = g[g["worker"] == worker]
            ax.bar(w["t"] + 0.05, w["jobs"], width=0.1, color=color,
                   label=f"{worker} worker ({'active' if worker == 'first' else 'standby'})")
        ax.axvline(0, color="black", linestyle="--", linewidth=1)
        ax.set_title(f"{name}: jobs completed per 100 ms (signal at 0 s)")
        ax.set_xlabel("seconds from the signal")
        ax.set_ylabel("jobs")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def recovery_times_plot(times: pd.DataFrame) -> plt.Figure:
    signals = list(dict.fromkeys(times["signal"]))
    fig, axes = plt.subplots(1, len(signals), figsize=(3.2 * len(signals), 3.4), squeeze=False)
    for ax, name in zip(axes[0], signals, strict=True):
        values = times[times["signal"] == name]["seconds"]
        ax.plot([1] * len(values), values, "o", alpha=0.6)
        ax.boxplot(values, widths=0.4)
        ax.set_xticks([])
        ax.set_title(name)
        ax.set_ylabel("recovery (s)")
    fig.tight_layout()
    return fig


# -- beside the peers -----------------------------------------------------------------

#: One colour per system in every comparison figure.
SYSTEM_COLORS = {"jobqueue": "tab:blue", "pgqueuer": "tab:orange",
                 "procrastinate": "tab:green", "graphile-worker": "tab:purple",
                 "course design": "tab:gray"}
SYSTEM_NAMES = {"jobqueue": "jobqueue", "pgqueuer": "PgQueuer",
                "procrastinate": "Procrastinate", "graphile-worker": "graphile-worker",
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
    extra = df.groupby(_SETUP).agg(preset=("preset", "first"))
    if "rss_peak_mib" in df.columns:
        extra["rss_peak_mib"] = df.groupby(_SETUP)["rss_peak_mib"].max()
    s = s.merge(extra.reset_index(), on=_SETUP, how="left")
    keys = list(zip(*(df[c] for c in _SETUP), strict=True))
    order = {key: i for i, key in enumerate(dict.fromkeys(keys))}
    s["order"] = [order[k] for k in zip(*(s[c] for c in _SETUP), strict=True)]
    return s.sort_values("order").drop(columns="order").reset_index(drop=True)


def peer_drain_table(df: pd.DataFrame) -> pd.DataFrame:
    """Drain throughput of every setup: processes, jobs drained, median jobs/s
    (min–max over the rounds) and the peak RSS."""
    s = peer_drain_spread(df)
    table = pd.DataFrame({"system": s["system"].map(SYSTEM_NAMES), "settings": s["settings"],
                          "processes": s["workers"], "n": s["n"],
                          f"{RATE} (min–max)": s.apply(_range, axis=1), "runs": s["runs"]})
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


def peer_latency_table(df: pd.DataFrame) -> pd.DataFrame:
    """p50 and p99 to start and to completion, medians over runs, per rate and system."""
    cols = ["achieved_rate", "start_p50_ms", "start_p99_ms", "complete_p50_ms",
            "complete_p99_ms"]
    med = df.groupby(["rate", "system", "settings"], sort=False)[cols].median().reset_index()
    med["o"] = med["system"].map(list(SYSTEM_COLORS).index)
    med = med.sort_values(["rate", "o"]).reset_index(drop=True)
    return pd.DataFrame({
        "arrivals (jobs/s)": med["rate"], "system": med["system"].map(SYSTEM_NAMES),
        "settings": med["settings"], "achieved": med["achieved_rate"],
        "to start p50 (ms)": med["start_p50_ms"], "to start p99 (ms)": med["start_p99_ms"],
        "to completion p50 (ms)": med["complete_p50_ms"],
        "to completion p99 (ms)": med["complete_p99_ms"]}).round(1)


def peer_latency_plot(df: pd.DataFrame) -> plt.Figure:
    """p50 (circles) and p99 (squares) against the arrival rate, to start
    and to completion, one colour per system."""
    med = df.groupby(["system", "rate"]).median(numeric_only=True).reset_index()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, (what, prefix) in zip(axes, (("start", "start_"), ("completion", "complete_")),
                                  strict=True):
        for system in _system_order(med):
            g = med[med["system"] == system]
            color = SYSTEM_COLORS[system]
            ax.plot(g["rate"], g[f"{prefix}p50_ms"], "o-", color=color,
                    label=f"{SYSTEM_NAMES[system]} p50")
            ax.plot(g["rate"], g[f"{prefix}p99_ms"], "s--", color=color,
                    label=f"{SYSTEM_NAMES[system]} p99")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arrival rate (jobs/s, open loop)")
        ax.set_title(f"enqueue → {what}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("milliseconds")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def peer_latency_cdf(samples: pd.DataFrame, rate: float | None = None) -> plt.Figure:
    """Share of jobs completed within x ms of being enqueued, per system, at
    one arrival rate (the middle one unless told)."""
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
    ax.set_title(f"Latency distribution at {rate:g} jobs/s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def peer_memory_table(df: pd.DataFrame) -> pd.DataFrame:
    """Resident memory of one worker at the start and end of a long drain, and its peak."""
    return pd.DataFrame({
        "system": df["system"].map(SYSTEM_NAMES), "settings": df["settings"],
        "jobs drained": df["n"], f"{RATE}": df["jobs_per_sec"],
        "RSS at first claim (MiB)": df["rss_start_mib"],
        "RSS at last completion (MiB)": df["rss_end_mib"],
        "peak RSS (MiB)": df["rss_peak_mib"]}).round(1)


def peer_memory_plot(timeline: pd.DataFrame) -> plt.Figure:
    """Each worker's RSS over its drain (t = 0 at the first claim)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for system in _system_order(timeline):
        g = timeline[timeline["system"] == system]
        n = int(g["n"].iloc[0])
        ax.plot(g["t"], g["rss_mib"], color=SYSTEM_COLORS[system],
                label=f"{SYSTEM_NAMES[system]} ({n:,} jobs, {g['settings'].iloc[0]})")
    ax.axvline(0, color="black", linestyle=":", linewidth=1)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("seconds from the first claim")
    ax.set_ylabel("worker resident memory (MiB)")
    ax.set_title("One worker's memory while it drains")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
