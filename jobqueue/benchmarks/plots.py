"""Tables and figures from the results files: the notebooks show them, and
`report` saves them into BENCHMARKS.md. What a reader must know about a
figure (a drain too short, a rate not reached, a worker that joined late, a
goal not met) is a flag in the table it concerns, not a sentence."""

from __future__ import annotations

import math
import re
import shlex
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import ScalarFormatter

from jobqueue.benchmarks.scenarios import MET_SHARE, MIN_DRAIN_SECONDS, QUANTILES, quantile_name

RATE = "jobs/s"


def spread(df: pd.DataFrame, by: list[str], value: str) -> pd.DataFrame:
    """Median, min and max of `value` over repetitions, per group."""
    out = df.groupby(by, sort=True)[value].agg(["median", "min", "max", "count"]).reset_index()
    return out.rename(columns={"count": "runs"})


def markdown(df: pd.DataFrame, floatfmt: str = ",.0f") -> str:
    """A DataFrame as a Markdown table (numbers formatted, no index)."""
    def fmt(v: Any) -> str:
        return (format(v, floatfmt) if isinstance(v, float) else
                format(v, ",") if isinstance(v, int) else str(v))

    header = "| " + " | ".join(str(c) for c in df.columns) + " |"
    rule = "|" + "|".join("---:" if pd.api.types.is_numeric_dtype(df[c]) else "---"
                          for c in df.columns) + "|"
    rows = ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([header, rule, *rows])


def _range(row: pd.Series) -> str:
    return f"{row['median']:,.0f} ({row['min']:,.0f}–{row['max']:,.0f})"


def _ms(v: Any, fmt: str = ",.1f") -> str:
    return "–" if v is None or pd.isna(v) else format(v, fmt)


def _count(v: Any) -> str:
    return "–" if pd.isna(v) else f"{int(v):,}"


# -- throughput -----------------------------------------------------------------

SHORT_FLAG = f"drain under {MIN_DRAIN_SECONDS:g} s"
PARTIAL_FLAG = "not every worker took part"
#: A shared drain whose last worker joined later than this share of the
#: drain is flagged: for that long, fewer workers drained than it says.
LATE_SHARE = 0.1
LATE_FLAG = f"a worker joined after {LATE_SHARE:.0%} of the drain"
BEST_FLAG = "fastest setting without a flag"


def counted(df: pd.DataFrame) -> pd.DataFrame:
    """The drains the figures use: without the sizing runs `drain_matrix`
    ran again bigger."""
    return df[df["counted"].astype(bool)] if "counted" in df.columns else df


def drain_summary(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Per setting, over the counted drains: `spread` of jobs/s and the flags
    `short` (a drain under MIN_DRAIN_SECONDS) and `partial` (fewer workers took
    jobs than the mode puts to work, or the last joined late)."""
    df = counted(df)
    df = df.assign(expected=df["workers"].where(df["mode"] == "shared", 1),
                   skew=df["start_skew_s"] if "start_skew_s" in df else 0.0)
    df = df.assign(short=df["seconds"] < MIN_DRAIN_SECONDS,
                   part=df["workers_used"] < df["expected"],
                   late=df["skew"] > LATE_SHARE * df["seconds"])
    extra = df.groupby(by, sort=True).agg(
        seconds_min=("seconds", "min"), seconds_max=("seconds", "max"), n_min=("n", "min"),
        n_max=("n", "max"), used_min=("workers_used", "min"), used_max=("workers_used", "max"),
        short_runs=("short", "sum"), partial_runs=("part", "sum"), skew_max=("skew", "max"),
        late_runs=("late", "sum")).reset_index()
    s = spread(df, by, "jobs_per_sec").merge(extra, on=by)
    s["short"] = s["short_runs"] > 0
    s["partial"] = (s["partial_runs"] > 0) | (s["late_runs"] > 0)
    return s


def _span(low: float, high: float, fmt: str = ",.0f") -> str:
    return format(low, fmt) if low == high else f"{low:{fmt}}–{high:{fmt}}"


def _flags(row: pd.Series) -> str:
    return "; ".join(f"⚠ {flag} ({row[key]} of {row['runs']}{runs})"
                     for flag, key, runs in ((SHORT_FLAG, "short_runs", ""),
                                             (PARTIAL_FLAG, "partial_runs", " runs"),
                                             (LATE_FLAG, "late_runs", " runs")) if row[key])


def _drain_table(s: pd.DataFrame, head: dict[str, Any], drop: tuple[str, ...] = (),
                 beside: dict[str, Any] | None = None,
                 before_runs: dict[str, Any] | None = None) -> pd.DataFrame:
    """A drain table: the setting's columns (`head`), jobs/s (`beside` it),
    what the drains were, `before_runs`, then runs and flags."""
    cols = pd.DataFrame({
        f"{RATE}, median (min–max)": s.apply(_range, axis=1), **(beside or {}),
        "drain s (min–max)": [_span(a, b, ".2f") for a, b in
                              zip(s["seconds_min"], s["seconds_max"], strict=True)],
        "jobs per drain": [_span(a, b) for a, b in zip(s["n_min"], s["n_max"], strict=True)],
        "workers used": [_span(a, b, "d") for a, b in
                         zip(s["used_min"].astype(int), s["used_max"].astype(int), strict=True)],
        "last joined (s)": s["skew_max"].map(lambda v: f"{v:.2f}"), **(before_runs or {}),
        "runs": s["runs"], "flags": s.apply(_flags, axis=1)})
    return pd.concat([pd.DataFrame(head), cols.drop(columns=list(drop))], axis=1)


_MATRIX = ["mode", "workers", "batch_size"]


def throughput_table(df: pd.DataFrame, by: tuple[str, ...] = (), best: bool = True
                     ) -> pd.DataFrame:
    """One row per (`by` ×) mode × worker count × batch size; the fastest
    setting without a flag is marked as such."""
    s = drain_summary(df, [*by, *_MATRIX])
    table = _drain_table(s, s[[*by, *_MATRIX]].rename(columns={"batch_size": "batch size"}))
    clean = s[~s["short"] & ~s["partial"]]
    if best and len(clean):
        table.loc[clean["median"].idxmax(), "flags"] = f"★ {BEST_FLAG}"
    return table


def work_table(df: pd.DataFrame) -> pd.DataFrame:
    """Jobs that do something, per handler and setting."""
    return throughput_table(df, ("handler",), best=False)


def _finish(fig: Any, ax: Any, xlabel: str, ylabel: str, title: str, **title_kw: Any) -> Any:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, **title_kw)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig


def _drain_plot(df: pd.DataFrame, by: list[str], x: str, lines: list[str],
                figsize: tuple[float, float], xlabel: str, ylabel: str, title: str,
                log_y: bool) -> plt.Figure:
    """Medians with min–max whiskers against `x`, a line per `lines` value
    (shared drains solid), flagged settings circled in red."""
    s = drain_summary(df, by)
    fig, ax = plt.subplots(figsize=figsize)
    series: Any = s.groupby(lines) if lines else [(("shared", 0), s)]
    for (mode, workers), g in series:
        ax.errorbar(g[x], g["median"], yerr=[g["median"] - g["min"], g["max"] - g["median"]],
                    capsize=3, marker="o" if mode == "shared" else "s",
                    linestyle="-" if mode == "shared" else "--",
                    label=f"{mode}, {workers} worker{'s' if workers > 1 else ''}" if lines
                    else None)
    flagged = s[s["short"] | s["partial"]]
    if len(flagged):
        ax.plot(flagged[x], flagged["median"], "o", markersize=13, markerfacecolor="none",
                markeredgecolor="red", label="flagged (see the table)")
    if lines or len(flagged):
        ax.legend(fontsize=8)
    ax.set_xscale("log")
    if log_y:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    return _finish(fig, ax, xlabel, ylabel, title)


def throughput_plot(df: pd.DataFrame) -> plt.Figure:
    return _drain_plot(df, _MATRIX, "batch_size", ["mode", "workers"], (7, 4.2),
                       "batch size (jobs per transaction)",
                       f"drain throughput ({RATE}, median, min–max)",
                       f"Draining {WORKLOADS.get(workload(df), workload(df))}", log_y=True)


def table_size_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per table size: jobs/s, and what the drain left and cost the server."""
    s = drain_summary(df, ["n"])
    medians = counted(df).groupby("n").median(numeric_only=True).reset_index(drop=True)
    cost = {name: medians[column].round(0) if column == "wal_mib" else medians[column]
            for column, name in (("dead_tuples", "dead tuples after"),
                                 ("autovacuums", "autovacuums during"), ("wal_mib", "WAL MiB"),
                                 ("full_page_images", "full-page images"),
                                 ("checkpoints", "checkpoints"))
            if column in medians}  # results written before these columns existed lack them
    return _drain_table(s, {"jobs in table": s["n"]},
                        ("jobs per drain", "workers used", "last joined (s)"), before_runs=cost)


def table_size_plot(df: pd.DataFrame) -> plt.Figure:
    return _drain_plot(df, ["n"], "n", [], (6, 3.8), "jobs in the table at the start",
                       f"drain throughput ({RATE})", "Does cost grow with the table?",
                       log_y=False)


def _climbing(later: float, earlier: float) -> bool:
    """A peak in the last third more than half again the second third's."""
    return bool(later > 1.5 * max(earlier, 1))


def soak_table(summary: pd.DataFrame) -> pd.DataFrame:
    """The long run in one row, flagged where it would not stay healthy for weeks."""
    cols = {"rate": "jobs/s", "seconds": "seconds", "keep_seconds": "kept (s)",
            "dead_peak_middle": "dead rows, peak (2nd third)",
            "dead_peak_last": "dead rows, peak (last third)",
            "live_peak_last": "live rows, peak (last third)",
            "table_mib_end": "table MiB at the end", "autovacuums": "autovacuums",
            "rss_mib_start": "worker RSS MiB, start", "rss_mib_end": "worker RSS MiB, end"}

    def flags(r: pd.Series) -> str:
        out = ["⚠ dead rows still climbing"] if _climbing(r["dead_peak_last"],
                                                          r["dead_peak_middle"]) else []
        if not pd.isna(r.get("table_mib_middle")) and _climbing(r["table_mib_end"],
                                                                 r["table_mib_middle"]):
            out.append("⚠ table still growing")
        if r["rss_mib_end"] > 1.1 * r["rss_mib_start"]:
            out.append("⚠ worker RSS grew over 10 %")
        return "; ".join(out)

    return summary[list(cols)].rename(columns=cols).assign(flags=summary.apply(flags, axis=1))


def soak_plot(timeline: pd.DataFrame) -> plt.Figure:
    fig, (rows, size, memory) = plt.subplots(1, 3, figsize=(13, 3.6))
    for column, label in (("live", "live rows"), ("dead", "dead rows"),
                          ("backlog", "waiting jobs")):
        rows.plot(timeline["t"], timeline[column], label=label)
    rows.set_title("jobs table: rows")
    size.plot(timeline["t"], timeline["table_mib"], label="table")
    size.plot(timeline["t"], timeline["pickable_index_mib"], label="idx_jobs_pickable")
    size.set_title("on disk (MiB)")
    memory.plot(timeline["t"], timeline["rss_mib"], color="C3")
    memory.set_ylim(bottom=0)
    memory.set_title("worker resident memory (MiB)")
    for ax in (rows, size, memory):
        ax.set_xlabel("seconds into the run")
        ax.grid(True, alpha=0.3)
    rows.legend()
    size.legend()
    fig.tight_layout()
    return fig


def _summary(df: pd.DataFrame, by: list[str], **first: str) -> pd.DataFrame:
    """`drain_summary` with columns describing each setup beside it."""
    g = counted(df).groupby(by, sort=True)
    extra = pd.DataFrame({k: g[c].first() for k, c in first.items()}).reset_index()
    return drain_summary(df, by).merge(extra, on=by)


def sync_table(df: pd.DataFrame) -> pd.DataFrame:
    """A row per handler, with what a job costs (µs: one second over the median)."""
    s = _summary(df, ["setup_order", "work", "kind", "handler"], threads="threads")
    return _drain_table(
        s, {"work": s["work"], "handler": s["kind"] + " (`" + s["handler"] + "`)"},
        ("workers used", "last joined (s)"),
        beside={"µs per job": (1e6 / s["median"]).round(0),
                "threads": s["threads"].where(s["kind"] == "sync", "–")})


# -- queues and priorities --------------------------------------------------------

_ROUTING = ["setup_order", "setup"]


def routing_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per routing setup: `drain_summary` and how priority held (`late_*`: the
    jobs completed after a job of lower priority in their queue)."""
    s = _summary(df, _ROUTING, queues="queues", priorities="priorities",
                 priority_range="priority_range", settings="settings", argv="argv")
    g = counted(df).groupby(_ROUTING, sort=True)
    late = pd.DataFrame({"late_median": g["late_jobs"].median(), "late_max": g["late_jobs"].max(),
                         "late_by_max_s": g["late_by_s"].max()}).reset_index()
    return s.merge(late, on=_ROUTING)


def routing_table(df: pd.DataFrame) -> pd.DataFrame:
    """A row per routing setup, its jobs/s also against the first's (one queue)."""
    s = routing_summary(df)
    return _drain_table(
        s, {"setup": s["setup"], "priorities": s["priority_range"],
            "worker": s["settings"].map(short_settings)}, ("workers used", "last joined (s)"),
        before_runs={
            "× the first setup": (s["median"] / s["median"].iloc[0]).map(lambda v: f"{v:.2f}"),
            "completed after a lower priority (median)": [
                f"{m:,.0f} ({m / n:.1%})"
                for m, n in zip(s["late_median"], s["n_max"], strict=True)],
            "late by at most (ms)": (s["late_by_max_s"] * 1000).map(lambda v: f"{v:,.1f}")})


def routing_plot(df: pd.DataFrame, spans: pd.DataFrame) -> plt.Figure:
    """A panel per setup with more than one priority, from its last run: a
    line per queue and priority from its first completed job to its last."""
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

QUANTILE_NAMES = {quantile_name(q): q for q in QUANTILES}


def min_samples(q: float) -> int:
    """Samples a q-quantile needs before it is more than the largest value
    or an interpolation past it: 1 / (1 - q) (p99: 100, p99.9: 1,000)."""
    return math.ceil(round(1 / (1 - q), 9))


def _steady(samples: pd.DataFrame) -> pd.DataFrame:
    return samples[~samples["warmup"].astype(bool)] if "warmup" in samples else samples


def latency_stats(df: pd.DataFrame, samples: pd.DataFrame) -> pd.DataFrame:
    """Per arrival rate: the rate achieved and whether it was met, and each
    quantile of the runs' samples pooled, NaN where too few carry it."""
    steady = _steady(samples)
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


def latency_table(df: pd.DataFrame, samples: pd.DataFrame) -> pd.DataFrame:
    """`latency_stats` as shown: "–" for a quantile the samples cannot carry,
    ⚠ beside an arrival rate not met."""
    st = latency_stats(df, samples)
    out = pd.DataFrame({
        "arrivals (jobs/s)": st["rate"],
        "achieved (jobs/s)": [f"{a:,.0f}" + ("" if m else f" ⚠ under {MET_SHARE:.0%}")
                              for a, m in zip(st["achieved"], st["met"], strict=True)],
        "runs": st["runs"], "warm-up left out (s)": st["warmup_s"].map(lambda v: f"{v:g}"),
        "samples (pooled)": st["samples"]})
    if "jobs_per_commit" in st:
        out["jobs per commit"] = st["jobs_per_commit"].map(lambda v: f"{v:,.1f}")
    return out.assign(**_quantiles(st, QUANTILE_NAMES))


def _quantiles(df: pd.DataFrame, names: Any) -> dict[str, pd.Series]:
    """The columns of each quantile `names` to start and to completion that `df` has."""
    return {f"to {what} {q.replace('_', '.')} (ms)": df[f"{prefix}_{q}_ms"].map(_ms)
            for what, prefix in (("start", "start"), ("completion", "complete"))
            for q in names if f"{prefix}_{q}_ms" in df}


def latency_plot(df: pd.DataFrame, samples: pd.DataFrame) -> plt.Figure:
    """Enqueue → completion quantiles against the rate achieved (not the
    target); an unmet rate is drawn hollow and labelled with its target."""
    st = latency_stats(df, samples)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for (q, style), color in zip((("p50", "o-"), ("p99", "s-"), ("p99_9", "^-")),
                                 ("C0", "C1", "C2"), strict=True):
        col = f"complete_{q}_ms"
        have = st[st[col].notna()]
        ax.plot(have["achieved"], have[col], style, color=color, label=q.replace("_", "."))
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
    ax.legend(fontsize=8)
    warm = float(st["warmup_s"].max())
    return _finish(fig, ax, "arrival rate achieved (jobs/s, open loop)",
                   "enqueue → completion (ms)", "Latency under load" + (
                       f" (first {warm:g} s of each run left out)" if warm > 0 else ""),
                   fontsize=10)


def latency_histogram(samples: pd.DataFrame) -> plt.Figure:
    """The distribution per arrival rate, the warm-up left out."""
    positive = _steady(samples)
    positive = positive[positive["to_complete_ms"] > 0]
    fig, ax = plt.subplots(figsize=(6.5, 4))
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

#: What tells one recovery setup from another in a results file.
RECOVERY_KEYS = ["path", "flags", "job_ms"]


def recovery_setups(times: pd.DataFrame) -> list[tuple[tuple[Any, ...], str]]:
    """Each setup of a run (in the order it ran) with its label: the path,
    the job length, and the flags that set it apart from the others (the
    ones all share are `recovery_common_flags`)."""
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
    `--import` and `--log-level`, which tables leave out)."""
    pairs = [_flag_pairs(f) for f in dict.fromkeys(times[column])]
    return " ".join(f"{f} {v}".strip() for f, v in pairs[0]
                    if all((f, v) in other for other in pairs[1:]))


def _flag_pairs(flags: str) -> list[tuple[str, str]]:
    words = shlex.split(flags)
    return [(w, words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else "")
            for i, w in enumerate(words) if w.startswith("--")]


def _recovery_groups(times: pd.DataFrame) -> list[tuple[str, str, pd.DataFrame]]:
    """(setup label, signal, its trials) in the order they ran."""
    groups = []
    for key, label in recovery_setups(times):
        of_setup = times[(times[RECOVERY_KEYS] == pd.Series(key, index=RECOVERY_KEYS)).all(axis=1)]
        for name in dict.fromkeys(of_setup["signal"]):
            groups.append((label, name, of_setup[of_setup["signal"] == name]))
    return groups


def _ints(values: pd.Series) -> str:
    return _span(int(values.min()), int(values.max()), "d")


def recovery_table(df: pd.DataFrame) -> pd.DataFrame:
    """A row per setup and signal."""
    rows = []
    for label, name, g in _recovery_groups(df):
        done = g["held_done_s"].dropna()
        rows.append({
            "setup": label, "signal": name, "trials": len(g),
            "median (s)": g["seconds"].median(), "min (s)": g["seconds"].min(),
            "max (s)": g["seconds"].max(), "lease (s)": f"{g['lease'].max():g}",
            "first job started, median (s)": g["started_s"].median(),
            "held at the signal": _ints(g["held_processing"]),
            "left processing": _ints(g["left_processing"]),
            "last held job done, median (s)": f"{done.median():.3f}" if len(done) else "–",
            "held jobs completed once": f"{int(g['held_completed_once'].sum())} of "
                                        f"{int(g['held_processing'].sum())}",
            "jobs not run exactly once": int(g["completed_not_once"].sum())})
    return pd.DataFrame(rows)


def _plain(label: str) -> str:
    return label.replace("`", "")


def _per_100ms(ax: Any, g: pd.DataFrame, by: str, labels: dict[str, str], since: str,
               zero: str | None = None) -> None:
    """Bars of the jobs completed per 100 ms, blue then orange per `by`, the event at 0 s."""
    for (value, label), color in zip(labels.items(), ("tab:blue", "tab:orange"), strict=True):
        of = g[g[by] == value]
        ax.bar(of["t"] + 0.05, of["jobs"], width=0.1, color=color, label=label)
    ax.axvline(0, color="black", linestyle="--", linewidth=1, label=zero)
    ax.set_xlabel(f"seconds from {since}", fontsize=8)
    ax.set_ylabel("jobs per 100 ms", fontsize=8)


def recovery_timeline_plot(times: pd.DataFrame, timeline: pd.DataFrame) -> plt.Figure:
    """A row per setup, a column per signal: the trial with the median
    recovery, completions per 100 ms by worker, the signal at t = 0."""
    setups = recovery_setups(times)
    signals = list(dict.fromkeys(times["signal"]))
    fig, axes = plt.subplots(len(setups), len(signals), figsize=(5.2 * len(signals),
                                                                 2.5 * len(setups)),
                             squeeze=False)
    groups = {(label, sig): g for label, sig, g in _recovery_groups(times)}
    for row, (_, label) in enumerate(setups):
        for col, name in enumerate(signals):
            ax = axes[row, col]
            if (label, name) not in groups:
                ax.set_visible(False)
                continue
            trials = groups[(label, name)]
            setup = trials["setup"].iloc[0]
            trial = trials.sort_values("seconds").iloc[len(trials) // 2]["trial"]
            g = timeline[(timeline["setup"] == setup) & (timeline["signal"] == name)
                         & (timeline["trial"] == trial)]
            _per_100ms(ax, g, "worker", {"first": "first worker (active)",
                                         "second": "second worker (standby)"}, "the signal")
            held = int(trials.loc[trials["trial"] == trial, "held_processing"].iloc[0])
            ax.set_title(f"{name}: {_plain(label)}\n(held {held} processing; signal at 0 s)",
                         fontsize=8)
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


def failover_table(df: pd.DataFrame) -> pd.DataFrame:
    """The failover trials in one row."""
    resume = df["resume_s"]
    states = ", ".join(sorted(map(str, set(df["replication"])))) if "replication" in df else "?"
    return pd.DataFrame([{
        "trials": len(df), "kill → first job on the new primary, median (s)": resume.median(),
        "min (s)": resume.min(), "max (s)": resume.max(),
        "promotion, median (s)": df["promotion_s"].median(),
        "promotion, max (s)": df["promotion_s"].max(),
        "kill → promoted, median (s)": df["promoted_s"].median(),
        "promoted → first job, median (s)": df["after_promotion_s"].median(),
        "replication": states,
        "completed before the kill, kept": f"{int(df['kept_before'].sum()):,} of "
                                           f"{int(df['completed_before'].sum()):,}",
        "jobs completed": f"{int(df['completed'].sum()):,} of {int(df['jobs'].sum()):,}",
        "jobs not run exactly once": int(df["completed_not_once"].sum()),
        "ran twice": int(df["ran_twice"].sum())}])


def failover_timeline_plot(times: pd.DataFrame, timeline: pd.DataFrame) -> plt.Figure:
    """The trial with the median time to resume: jobs completed per 100 ms on
    the old primary and the new one, the kill at 0 s and the promotion marked."""
    trial = times.sort_values("resume_s").iloc[len(times) // 2]
    g = timeline[timeline["trial"] == trial["trial"]]
    fig, ax = plt.subplots(figsize=(6.4, 2.8))
    _per_100ms(ax, g, "server", {s: f"completed on the {s}" for s in ("old primary",
                                                                      "new primary")},
               "the kill", "SIGKILL of the primary")
    ax.axvline(trial["promoted_s"], color="tab:green", linestyle=":", linewidth=1.5,
               label=f"standby promoted ({trial['promoted_s']:.3f} s)")
    ax.set_title(f"Failover, median trial: first job on the new primary after "
                 f"{trial['resume_s']:.3f} s", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


# -- beside the peers -----------------------------------------------------------------

#: One colour per system in every comparison figure.
SYSTEM_COLORS = {"jobqueue": "tab:blue", "pgqueuer": "tab:orange",
                 "procrastinate": "tab:green", "oban-py": "tab:brown",
                 "graphile-worker": "tab:purple", "course design": "tab:gray"}
SYSTEM_NAMES = {"jobqueue": "jobqueue", "pgqueuer": "PgQueuer",
                "procrastinate": "Procrastinate", "oban-py": "oban-py",
                "graphile-worker": "graphile-worker", "course design": "course design"}
#: What each drain's jobs do, as headings and titles say it.
WORKLOADS = {"noop": "no-op jobs",
             "write_row": "jobs that INSERT one row (write_row)",
             "process_payment": "process_payment jobs (a balance UPDATE and a payment INSERT)"}
_SETUP = ["system", "settings", "workers", "n"]


def systems(df: pd.DataFrame) -> list[str]:
    """The systems of a results file, in the order the figures colour them."""
    return [s for s in SYSTEM_COLORS if s in set(df["system"])]


def workload(df: pd.DataFrame) -> str:
    """The drains' handler (`noop` for results written before the column existed)."""
    return str(df["handler"].iloc[0]) if "handler" in df.columns else "noop"


def usual_n(df: pd.DataFrame) -> int:
    """The n most setups drained (the one headings name; others are said)."""
    return int(df["n"].mode().max())


def peer_drain_spread(df: pd.DataFrame) -> pd.DataFrame:
    """`spread` of jobs/s per setup, in the order the setups ran."""
    df = df.assign(preset=df["preset"].fillna("") if "preset" in df.columns else "")
    s = spread(df, _SETUP, "jobs_per_sec")
    extra = df.groupby(_SETUP).agg(preset=("preset", "first"), seconds=("seconds", "median"))
    if "rss_peak_mib" in df.columns:
        extra["rss_peak_mib"] = df.groupby(_SETUP)["rss_peak_mib"].max()
    if "workers_used" in df.columns:
        extra["workers_used_min"] = df.groupby(_SETUP)["workers_used"].min()
    s = s.merge(extra.reset_index(), on=_SETUP, how="left")
    order = {key: i for i, key in enumerate(dict.fromkeys(zip(*(df[c] for c in _SETUP),
                                                              strict=True)))}
    s["order"] = [order[k] for k in zip(*(s[c] for c in _SETUP), strict=True)]
    return s.sort_values("order").drop(columns="order").reset_index(drop=True)


def peer_drain_table(df: pd.DataFrame) -> pd.DataFrame:
    """Every setup's drains, flagged under MIN_DRAIN_SECONDS (too short to measure)."""
    s = peer_drain_spread(df)
    table = pd.DataFrame({"system": s["system"].map(SYSTEM_NAMES), "settings": s["settings"],
                          "processes": s["workers"], "n": s["n"],
                          f"{RATE} (min–max)": s.apply(_range, axis=1), "runs": s["runs"],
                          "drain (s, median)": s["seconds"].map(
                              lambda v: f"{v:.1f}" + (" (short)" if v < MIN_DRAIN_SECONDS
                                                      else ""))})
    for column, name in (("workers_used_min", "fewest processes that took jobs"),
                         ("rss_peak_mib", "peak RSS (MiB)")):
        if column in s.columns:  # workers_used: jobqueue's drains record it (worker_id)
            table[name] = s[column].map(lambda v: _ms(v, ".0f"))
    return table


_JOBQUEUE_LABEL = re.compile(
    r"^(?:CLI defaults, as in the README )?\(`jobqueue worker (?P<argv>[^`]*)`"
    r"(?P<times> × \d+)?\): (?P<rest>.*)$")


def short_settings(settings: str) -> str:
    """A jobqueue label without its command line, for a figure's axis
    (`(`jobqueue worker --import m --shared` × 2): …` → `--shared × 2: …`;
    no flag but `--import`: `CLI defaults: …`). Other systems' unchanged."""
    match = _JOBQUEUE_LABEL.match(settings)
    if match is None:
        return settings
    words = shlex.split(match["argv"])
    flags = [w for i, w in enumerate(words)
             if w != "--import" and (i == 0 or words[i - 1] != "--import")]
    return f"{shlex.join(flags) or 'CLI defaults'}{match['times'] or ''}: {match['rest']}"


def plain_settings(settings: str) -> str:
    """A jobqueue label as a list quotes it: its command line and what it
    runs with (`jobqueue worker --import m` × 2: 2 lanes each, …)."""
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
    """Medians of each setup's runs at each rate; `rate_met`, `kept_up` false if any run's was."""
    keys = ["rate", "system", "settings"]
    cols = [c for c in df.columns if c.endswith("_ms") or c in (
        "achieved_rate", "completed_rate", "jobs", "warmup_s", "seconds")]
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
    """Per rate and setup ("–" where the sample does not carry a percentile)."""
    med = peer_latency_runs(df)
    table = pd.DataFrame({
        "arrivals asked (jobs/s)": med["rate"], "system": med["system"].map(SYSTEM_NAMES),
        "settings": med["settings"].map(short_settings),
        "achieved (jobs/s)": med["achieved_rate"].round(0),
        "rate": med.apply(latency_flag, axis=1), "runs": med["runs"]})
    for column, name in (("warmup_s", "warm-up left out (s)"), ("seconds", "counted (s)")):
        if column in med:
            table[name] = med[column].map(lambda v: f"{v:g}")
    table["jobs counted"] = med["jobs"].astype(int)
    return table.assign(**_quantiles(med, ("p50", "p99", "p99_9")))


def peer_latency_plot(df: pd.DataFrame) -> plt.Figure:
    """p50 (circles) and p99 (squares) against the rate achieved, to start
    and to completion; hollow markers flag a rate not met or a system that
    fell behind."""
    med = peer_latency_runs(df)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, (what, prefix) in zip(axes, (("start", "start_"), ("completion", "complete_")),
                                  strict=True):
        for system in systems(med):
            g = med[med["system"] == system]
            color = SYSTEM_COLORS[system]
            ok = g["rate_met"] & g["kept_up"]
            for q, marker, style in (("50", "o", "-"), ("99", "s", "--")):
                y = g[f"{prefix}p{q}_ms"]
                ax.plot(g["achieved_rate"], y, style, color=color,
                        label=f"{SYSTEM_NAMES[system]} p{q}")
                ax.scatter(g["achieved_rate"][ok], y[ok], marker=marker, color=color)
                ax.scatter(g["achieved_rate"][~ok], y[~ok], marker=marker, facecolors="none",
                           edgecolors=color)
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
    for system in systems(at):
        values = at[at["system"] == system]["to_complete_ms"].sort_values()
        share = [(i + 1) / len(values) for i in range(len(values))]
        ax.step(values.clip(lower=0.01), share, where="post", color=SYSTEM_COLORS[system],
                label=SYSTEM_NAMES[system])
    ax.set_xscale("log")
    ax.legend(fontsize=8)
    return _finish(fig, ax, "enqueue → completion recorded (ms)", "share of jobs",
                   f"Latency distribution, arrivals asked at {rate:g} jobs/s "
                   "(the table gives the rate achieved)", fontsize=9)


def peer_memory_table(df: pd.DataFrame) -> pd.DataFrame:
    """One worker's memory over a long drain, per 10,000 jobs where n differ."""
    return pd.DataFrame({
        "system": df["system"].map(SYSTEM_NAMES), "settings": df["settings"].map(short_settings),
        "jobs drained": df["n"], f"{RATE}": df["jobs_per_sec"].round(0),
        "RSS at first claim (MiB)": df["rss_start_mib"].round(1),
        "RSS at last completion (MiB)": df["rss_end_mib"].round(1),
        "peak RSS (MiB)": df["rss_peak_mib"].round(1),
        "change per 10,000 jobs (MiB)": df["rss_per_10k_jobs_mib"].round(2)})


def peer_memory_plot(timeline: pd.DataFrame) -> plt.Figure:
    """Each worker's RSS over its drain, against the share of the drain done,
    so that drains of different n share one axis."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for system in systems(timeline):
        g = timeline[timeline["system"] == system]
        total = float(g["drain_seconds"].iloc[0])
        g = g[(g["t"] >= 0) & (g["t"] <= total)]
        n = int(g["n"].iloc[0]) if len(g) else 0
        ax.plot(100 * g["t"] / total, g["rss_mib"], ".-", color=SYSTEM_COLORS[system],
                label=f"{SYSTEM_NAMES[system]} ({n:,} jobs, "
                      f"{short_settings(str(g['settings'].iloc[0])) if len(g) else ''})")
    ax.set_ylim(bottom=0)
    ax.set_xlim(0, 100)
    ax.legend(fontsize=7)
    return _finish(fig, ax, "share of the drain done (%, from the first claim to the last "
                   "completion)", "worker resident memory (MiB)",
                   "One worker's memory while it drains")


# -- under pressure: vacuum held back ---------------------------------------------

#: The issue's goal: with the horizon pinned for GOAL_PINNED_S at the base
#: rate, jobqueue's p99 within GOAL_FACTOR × its own baseline and below every
#: peer's, and back to baseline within GOAL_RECOVERY_S of the release.
GOAL_PINNED_S = 600.0
GOAL_FACTOR = 3.0
GOAL_RECOVERY_S = 30.0


def system_rows(df: pd.DataFrame, system: str) -> pd.DataFrame:
    """One system's phases, in the order they ran."""
    return df[df["system"] == system].sort_values("order").reset_index(drop=True)


def base_rate_pinned(rows: pd.DataFrame) -> pd.DataFrame:
    """The phases with the horizon pinned at the base rate: the goal's (a
    pinned phase of extra load is its own question)."""
    return rows[rows["pinned"].astype(bool) & rows["load"].isna()]


def _release(rows: pd.DataFrame) -> pd.Series | None:
    """The first phase without a pin after the last one with it."""
    pinned = rows.index[rows["pinned"].astype(bool)]
    after = rows.iloc[pinned.max() + 1:] if len(pinned) else rows.iloc[0:0]
    return None if after.empty else after.iloc[0]


def recovery_seconds(timeline: pd.DataFrame, df: pd.DataFrame, system: str) -> float | None:
    """Seconds from the release to the end of the first window after it
    whose p99 is within the worst window of the baseline; inf if none is by
    the end, None where no window carries a p99 to tell by."""
    rows = system_rows(df, system)
    release = _release(rows)
    g = timeline[timeline["system"] == system].sort_values("t")
    times = sorted(g["t"].unique())
    if release is None or len(times) < 2:
        return None
    step = times[1] - times[0]
    base = g[(g["t"] + step <= rows.iloc[0]["end_s"])]["complete_p99_ms"].dropna()
    after = g[g["t"] >= math.floor(release["start_s"] / step) * step]
    after = after[after["complete_p99_ms"].notna()]
    if base.empty or after.empty:
        return None
    back = after[after["complete_p99_ms"] <= base.max()]
    return math.inf if back.empty else float(back.iloc[0]["t"] + step - release["start_s"])


def _held(row: pd.Series) -> str:
    parts = (["holder"] if row["holder"] else []) + (
        [f"{int(row['readers'])} RR readers"] if row["readers"] else [])
    if not pd.isna(row["load"]):
        parts.append(f"{row['load']:g}× load" + (f" (of {row['sustained']:,.0f} sustained)"
                                                  if "sustained" in row else ""))
    return ", ".join(parts) or "nothing"


def _pressure_flags(df: pd.DataFrame, timeline: pd.DataFrame | None) -> pd.Series:
    """Per row: a load phase capped or fallen behind, jobs left unfinished
    (latencies then a lower bound) and, on jobqueue's rows, the issue's goal
    where this run misses it."""
    flags: dict[Any, list[str]] = {i: [] for i in df.index}
    for i, r in df.iterrows():
        if r.get("capped"):
            flags[i].append("capped at the producer's limit")
        if r["completed_per_s"] < 0.95 * r["achieved_rate"]:
            flags[i].append("⚠ fell behind: completed under 95 % of arrivals")
    for system in systems(df):
        rows = df[df["system"] == system].sort_values("order")
        base = rows.iloc[0]
        if int(base.get("unfinished", 0) or 0):
            flags[base.name].append(f"⚠ {int(base['unfinished']):,} jobs unfinished at the end: "
                                    "its latencies are a lower bound")
        release = _release(rows.reset_index())
        back = None if timeline is None else recovery_seconds(timeline, df, system)
        ours = system == "jobqueue"
        if release is not None and back is not None:
            flags[release["index"]].append(
                ("p99 not back to baseline by the end" if math.isinf(back) else
                 f"p99 back within baseline after {back:,.0f} s")
                + (f" (goal missed: {GOAL_RECOVERY_S:g} s)" if ours and back > GOAL_RECOVERY_S
                   else ""))
        if not ours:
            continue
        for i, r in base_rate_pinned(rows).iterrows():
            if r["complete_p99_ms"] > GOAL_FACTOR * base["complete_p99_ms"]:
                flags[i].append(f"goal missed: p99 over {GOAL_FACTOR:g}× baseline")
            peers = df[(df["system"] != system) & (df["phase"] == r["phase"])]
            if (peers["complete_p99_ms"] <= r["complete_p99_ms"]).any():
                flags[i].append("goal missed: a peer's p99 is lower")
    return pd.Series({i: "; ".join(f) for i, f in flags.items()})


def pressure_table(df: pd.DataFrame, timeline: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per system and phase, in the run's order."""
    d = df.sort_values(["system", "order"], key=lambda c: c.map(
        {s: i for i, s in enumerate(SYSTEM_COLORS)}) if c.name == "system" else c)
    base = d.groupby("system")["complete_p99_ms"].transform("first")
    dropped = d["dropped"] if "dropped" in d else pd.Series(0, index=d.index)
    return pd.DataFrame({
        "system": d["system"].map(SYSTEM_NAMES), "phase": d["phase"],
        "s": d["seconds"], "held": d.apply(_held, axis=1),
        "jobs/s asked": d["rate"].round(0),
        "achieved": [_count(a) + ("" if met else f" (not met, {_count(n)} dropped)")
                     for a, met, n in zip(d["achieved_rate"], d.get("rate_met", [True] * len(d)),
                                          dropped, strict=True)],
        "completed/s": d["completed_per_s"].round(0),
        "p50 (ms)": d["complete_p50_ms"].map(_ms), "p99 (ms)": d["complete_p99_ms"].map(_ms),
        "p99 ÷ baseline": (d["complete_p99_ms"] / base).map(lambda v: _ms(v, ",.1f")),
        "dead tuples": d["dead_tuples"].map(_count),
        "dead tuples by table": _text(d["dead_by_table"]) if "dead_by_table" in d else "",
        "tables + indexes (MiB)": d["total_mib"].round(1), "indexes (MiB)": d["index_mib"].round(1),
        "horizon held by": _text(d["horizon"]),
        "top wait events (samples)": _text(d["top_waits"]),
        "flags": _pressure_flags(df, timeline).reindex(d.index)})


def _text(column: pd.Series) -> pd.Series:
    """A column of text, blank where there is none: a column that a run
    left empty everywhere is read back as floats (all NaN), which pandas
    will not fill with a string."""
    return column.astype(object).where(column.notna(), "")


def pinned_goal_table(goals: list[dict[str, Any]]) -> pd.DataFrame:
    """`pressure.goal_rows`: each system's p50 and p99 late in the hold
    against its baseline, and whether both kept within the goal."""
    return pd.DataFrame([{
        "system": SYSTEM_NAMES.get(g["system"], g["system"]), "phase": g["phase"],
        "s": g["seconds"], "late jobs": _count(g["late_jobs"]),
        "p50 baseline → late (ms)": f"{_ms(g['baseline_p50_ms'])} → {_ms(g['late_p50_ms'])}",
        "p50 ×": _ms(g["p50_ratio"], ",.2f"),
        "p99 baseline → late (ms)": f"{_ms(g['baseline_p99_ms'])} → {_ms(g['late_p99_ms'])}",
        "p99 ×": _ms(g["p99_ratio"], ",.2f"),
        f"within {g['goal']:g}×": "yes" if g["met"] else "no"} for g in goals])


def probe_table(df: pd.DataFrame) -> pd.DataFrame:
    """jobqueue's claim at each phase's end: EXPLAIN (ANALYZE, BUFFERS) of `take`
    from a lane's floor (what the worker sends) and from the front (a life's
    first claim), and of a lane's write to the batch ledger."""
    d = df[df["system"] == "jobqueue"].sort_values("order")
    if d.empty or "take_buffers" not in d:
        return pd.DataFrame()

    def column(name: str) -> pd.Series:
        return d.get(name, pd.Series(math.nan, index=d.index))

    def ms(values: pd.Series) -> pd.Series:
        return values.map(lambda v: _ms(v, ",.2f"))

    return pd.DataFrame({"phase": d["phase"], "dead tuples": d["dead_tuples"].map(_count),
                         "take from the floor: buffers": d["take_buffers"].map(_count),
                         "ms": ms(d["take_ms"]),
                         "take from the front: buffers": column("front_buffers").map(_count),
                         "ms ": ms(column("front_ms")),
                         "ledger write: buffers": column("ledger_buffers").map(_count),
                         "job p50 (ms)": d["complete_p50_ms"].map(_ms)})


def waits_table(waits: pd.DataFrame, top: int = 5) -> pd.DataFrame:
    """The most frequent wait events per system and phase."""
    rows = []
    for (system, phase), g in waits.groupby(["system", "phase"], sort=False):
        g = g.sort_values("count", ascending=False).head(top)
        rows.append({"system": SYSTEM_NAMES.get(str(system), system), "phase": phase,
                     "wait events (samples)": ", ".join(
                         f"{w} {int(n)}" for w, n in zip(g["wait"], g["count"], strict=True))})
    return pd.DataFrame(rows, columns=["system", "phase", "wait events (samples)"])


def _bands(ax: Any, phases: pd.DataFrame, label: bool) -> None:
    for _, p in phases.iterrows():
        if p["pinned"]:
            ax.axvspan(p["start_s"], p["end_s"], color="tab:red",
                       alpha=0.06 + 0.06 * bool(p["readers"]) + 0.06 * (not pd.isna(p["load"])))
        if label:
            ax.text((p["start_s"] + p["end_s"]) / 2, 1.0, p["phase"], ha="center", va="bottom",
                    fontsize=8, transform=ax.get_xaxis_transform())


def pressure_plot(df: pd.DataFrame, timeline: pd.DataFrame) -> plt.Figure:
    """p99 (solid) and p50 (dotted) enqueue → completion per window, and the
    dead tuples in each system's tables, over the run; the phases as bands
    (shaded while something holds the horizon, darker with readers and load)."""
    fig, (lat, dead) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    first = system_rows(df, systems(df)[0])
    times = sorted(timeline["t"].unique())
    step = times[1] - times[0] if len(times) > 1 else 1.0
    for system in systems(timeline):
        g = timeline[timeline["system"] == system].sort_values("t")
        color, name = SYSTEM_COLORS[system], SYSTEM_NAMES[system]
        mid = g["t"] + step / 2
        lat.plot(mid, g["complete_p99_ms"], color=color, label=f"{name} p99")
        lat.plot(mid, g["complete_p50_ms"], ":", color=color, label=f"{name} p50")
        dead.plot(mid, g["dead_tuples"], color=color, label=name)
    _bands(lat, first, label=True)
    _bands(dead, first, label=False)
    lat.set_yscale("log")
    lat.set_ylabel("enqueue → completion (ms)")
    lat.legend(fontsize=7, ncol=3)
    dead.set_ylabel("dead tuples (its tables)")
    dead.set_xlabel(f"seconds into the run (windows of {step:g} s)")
    dead.legend(fontsize=7)
    for ax in (lat, dead):
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig
