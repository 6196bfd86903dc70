"""The pressure run (`pressure`) as tables, a figure and sentences: what the
notebook shows and BENCHMARKS.md's Pressure section renders, all computed from
the results files (`pressure.csv`, `pressure_timeline.csv`, `pressure_waits.csv`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from jobqueue.benchmarks import load
from jobqueue.benchmarks.plots import SYSTEM_COLORS, SYSTEM_NAMES, short_settings

#: The issue's goal: with the horizon pinned for GOAL_PINNED_S at GOAL_RATE
#: jobs/s, jobqueue's p99 within GOAL_FACTOR × its own baseline and below
#: every peer's, and back to baseline within GOAL_RECOVERY_S of the release.
GOAL_RATE = 500.0
GOAL_PINNED_S = 600.0
GOAL_FACTOR = 3.0
GOAL_RECOVERY_S = 30.0


def _ms(v: Any) -> str:
    return "–" if v is None or pd.isna(v) else f"{v:,.1f}"


def systems(df: pd.DataFrame) -> list[str]:
    """The systems of a run, in the order the figures colour them."""
    return [s for s in SYSTEM_COLORS if s in set(df["system"])]


def table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per system and phase, in the run's order."""
    d = df.sort_values(["system", "order"], key=lambda c: c.map(
        {s: i for i, s in enumerate(SYSTEM_COLORS)}) if c.name == "system" else c)
    return pd.DataFrame({
        "system": d["system"].map(SYSTEM_NAMES), "phase": d["phase"],
        "held": d.apply(_held, axis=1),
        "jobs/s asked": d["rate"].round(0),
        "achieved": d.apply(lambda r: _count(r["achieved_rate"]) + (
            "" if r.get("rate_met", True) else " (not met)"), axis=1),
        "completed/s": d["completed_per_s"].round(0),
        "p50 (ms)": d["complete_p50_ms"].map(_ms), "p99 (ms)": d["complete_p99_ms"].map(_ms),
        "dead tuples": d["dead_tuples"].map(_count), "tables + indexes (MiB)":
            d["total_mib"].round(1), "indexes (MiB)": d["index_mib"].round(1),
        "horizon held by": d["horizon"].fillna(""),
        "top wait events (samples)": d["top_waits"].fillna("")})


def _count(v: Any) -> str:
    return "–" if pd.isna(v) else f"{int(v):,}"


def _held(row: pd.Series) -> str:
    parts = (["holder"] if row["holder"] else []) + (
        [f"{int(row['readers'])} RR readers"] if row["readers"] else [])
    if not pd.isna(row["load"]):
        parts.append(f"{row['load']:g}× load")
    return ", ".join(parts) or "nothing"


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
        return values.map(lambda v: "–" if pd.isna(v) else f"{v:,.2f}")

    return pd.DataFrame({"phase": d["phase"], "dead tuples": d["dead_tuples"].map(_count),
                         "take from the floor: buffers": d["take_buffers"].map(_count),
                         "ms": ms(d["take_ms"]),
                         "take from the front: buffers": column("front_buffers").map(_count),
                         "ms ": ms(column("front_ms")),
                         "ledger write: buffers": column("ledger_buffers").map(_count),
                         "job p50 (ms)": d["complete_p50_ms"].map(_ms)})


def waits_table(waits: pd.DataFrame, top: int = 5) -> pd.DataFrame:
    """The most frequent wait events per system and phase (one count per
    active backend per sample)."""
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


def plot(timeline: pd.DataFrame, df: pd.DataFrame) -> plt.Figure:
    """p99 (solid) and p50 (dotted) enqueue → completion per window, and the
    dead tuples in each system's tables, over the run; the phases as bands
    (shaded while something holds the horizon, darker with readers and load)."""
    fig, (lat, dead) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    first = df[df["system"] == systems(df)[0]].sort_values("order")
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


# -- sentences ------------------------------------------------------------------------


def system_rows(df: pd.DataFrame, system: str) -> pd.DataFrame:
    """One system's phases, in the order they ran."""
    return df[df["system"] == system].sort_values("order").reset_index(drop=True)


def base_rate_pinned(rows: pd.DataFrame) -> pd.DataFrame:
    """The phases with the horizon pinned at the base rate: the goal's (a
    pinned phase of extra load is its own question)."""
    return rows[rows["pinned"].astype(bool) & rows["load"].isna()]


def _baseline(rows: pd.DataFrame) -> pd.Series:
    """The first phase, before anything pinned the horizon."""
    return rows.iloc[0]


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
    if base.empty:
        return None
    band = base.max()
    after = g[g["t"] >= math.floor(release["start_s"] / step) * step]
    after = after[after["complete_p99_ms"].notna()]
    if after.empty:
        return None
    back = after[after["complete_p99_ms"] <= band]
    return math.inf if back.empty else float(back.iloc[0]["t"] + step - release["start_s"])


def method(df: pd.DataFrame, context: dict[str, str]) -> list[str]:
    """How the run was made, from its rows and header."""
    rows = system_rows(df, systems(df)[0])
    pinned = rows[rows["pinned"].astype(bool)]
    phases = "; ".join(f"{r['phase']} {r['seconds']:g} s ({_held(r)})" for _, r in rows.iterrows())
    interval = context.get("pressure_interval", "?")
    window = context.get("pressure_window", "?")
    cap = context.get("pressure_max_rate")
    cap = "?" if cap is None else f"{float(cap):,.0f}"
    return [
        "Each system in turn, in its own database, with one worker process configured as in "
        "the comparison above; jobs arrive one at a time, each in its own transaction, at "
        "scheduled times (open loop), through the same asyncpg producer for every system. "
        f"Phases, one after another without a pause: {phases}. The *holder* is a session "
        "that ran `SELECT pg_current_xact_id()` in a transaction it leaves open (idle in "
        "transaction); *RR readers* each keep one REPEATABLE READ transaction open through "
        "their phases and scan the system's tables with `count(*)` again and again. Both "
        f"pin the xmin horizon: for {pinned['seconds'].sum():,.0f} s here, vacuum can remove "
        "nothing that died after the holder began. Before the phases, a drain of no-op jobs "
        "already queued measures what the worker sustains; the load phase asks for that "
        f"multiple of it, capped at {cap} jobs/s (what one producer process "
        "can send), and a system that sustains less than the base rate gets a share of what "
        "it sustains instead (the table gives each phase's rate). Latency is enqueue → "
        "completion from each system's own timestamps (as in the comparison), of the jobs "
        f"enqueued in the phase, the first {context.get('pressure_warmup', '?')} s of the run "
        "left out (warm-up); p99 only where 100 "
        "jobs carry it. Dead tuples (`n_dead_tup`) and sizes (`pg_total_relation_size`, "
        "`pg_indexes_size`) are the system's own tables at the phase's last sample; wait "
        f"events are what its active sessions waited on, sampled every {interval} s "
        "(`CPU`: no wait event); the figure's windows are "
        f"{window} s."]


def _times(base: float, value: float) -> str:
    return "" if pd.isna(base) or pd.isna(value) or base <= 0 else f" ({value / base:,.1f}×)"


def _back(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if math.isinf(seconds):
        return "; no window was back within the baseline's worst one by the end of the run"
    return (f"; the first window back within the baseline's worst one ended {seconds:,.0f} s "
            "after the release")


def _text(v: Any, empty: str = "nothing sampled") -> str:
    return empty if v is None or pd.isna(v) or not str(v) else str(v)


def findings(df: pd.DataFrame, timeline: pd.DataFrame) -> list[str]:
    """Per system: baseline, what the pin did to p99 and the tables, the load
    phase, what its sessions waited on, how soon it came back; jobqueue's claim."""
    lines = []
    for system in systems(df):
        rows = system_rows(df, system)
        base = _baseline(rows)
        pinned = rows[rows["pinned"].astype(bool)]
        name = SYSTEM_NAMES[system]
        if pinned.empty:
            continue
        end = pinned.iloc[-1]
        rises = ", ".join(f"{_ms(r['complete_p99_ms'])} ms in {r['phase']}"
                          f"{_times(base['complete_p99_ms'], r['complete_p99_ms'])}"
                          for _, r in pinned.iterrows())
        line = (f"**{name}** ({short_settings(base['settings'])}) at {base['rate']:,.0f} jobs/s: "
                f"p50 {_ms(base['complete_p50_ms'])} ms and p99 {_ms(base['complete_p99_ms'])} ms "
                f"at baseline; with the horizon pinned, p99 {rises}. Its tables held "
                f"{_count(end['dead_tuples'])} dead tuples at the end of {end['phase']} "
                f"({end['dead_by_table']}) and took {end['total_mib']:,.1f} MiB "
                f"({end['index_mib']:,.1f} MiB of indexes), against "
                f"{_count(base['dead_tuples'])} and {base['total_mib']:,.1f} MiB at baseline.")
        release = _release(rows)
        back = recovery_seconds(timeline, df, system)
        if release is not None:
            line += (f" After the release, p99 {_ms(release['complete_p99_ms'])} ms in "
                     f"{release['phase']}" + _back(back) + ".")
        unfinished = int(base.get("unfinished", 0) or 0)
        if unfinished:
            line += (f" {_count(unfinished)} of its jobs had not completed when the run stopped "
                     "waiting for them, after the last phase: its latencies count only the "
                     "jobs that did, a lower bound.")
        lines.append(line)
        for _, r in rows[rows["load"].notna()].iterrows():
            cap = " (capped at the producer's limit)" if r["capped"] else ""
            behind = ("" if r["completed_per_s"] >= 0.95 * r["achieved_rate"]
                      else ": it fell behind, the backlog grew")
            lines.append(
                f"{name}'s {r['phase']} phase asked {r['load']:g}× the {r['sustained']:,.0f} "
                f"jobs/s its worker drained, {r['rate']:,.0f} jobs/s{cap}; arrivals came at "
                f"{r['achieved_rate']:,.0f}/s and it completed {r['completed_per_s']:,.0f}/s"
                f"{behind}.")
        worst = pinned.loc[pinned["complete_p99_ms"].idxmax()] if (
            pinned["complete_p99_ms"].notna().any()) else end
        lines.append(f"{name}'s sessions waited on: {_text(base['top_waits'])} at baseline; "
                     f"{_text(worst['top_waits'])} in {worst['phase']}.")
    unmet = df[~df["rate_met"].astype(bool)] if "rate_met" in df else df.iloc[0:0]
    if len(unmet):
        lines.append(
            "The producer did not reach the rate asked in "
            + "; ".join(f"{SYSTEM_NAMES[r['system']]}'s {r['phase']} ({r['achieved_rate']:,.0f} "
                        f"of {r['rate']:,.0f} jobs/s, {_count(r.get('dropped', 0))} arrivals "
                        "dropped)" for _, r in unmet.iterrows())
            + ": those phases measure the rate that arrived (an arrival that would have "
            "waited more than a second to be sent is dropped, so that every phase lasts "
            "what it says)."
            + (" The top wait event there, `Lock:object`, is the lock that orders the commits "
               "of transactions that sent a NOTIFY, which every enqueue of all three systems "
               "does (a trigger wakes the workers): the producer's commits take turns, each "
               "waiting for the one before to be flushed."
               if unmet["top_waits"].fillna("").str.startswith("Lock:object").any() else ""))
    lines += take_findings(df)
    return lines


def take_findings(df: pd.DataFrame) -> list[str]:
    """jobqueue's claim at baseline's end against the last pinned phase's end."""
    rows = system_rows(df, "jobqueue")
    if rows.empty or "take_buffers" not in rows or rows["take_buffers"].isna().all():
        return []
    base, pinned = _baseline(rows), rows[rows["pinned"].astype(bool)]
    if pinned.empty:
        return []
    end = pinned.iloc[-1]
    share = ("" if pd.isna(end["complete_p50_ms"]) or end["complete_p50_ms"] <= 0 else
             f"; one claim is then {end['take_ms'] / end['complete_p50_ms']:.0%} of a job's "
             f"median enqueue → completion ({_ms(end['complete_p50_ms'])} ms), and a job "
             "waits for at least one")
    grew = end["take_buffers"] >= 2 * max(base["take_buffers"], 1)
    why = (": its index scan steps over the entries of the jobs finished since the pin, each "
           "pointing at a version that is dead but not yet dead to everyone" if grew else "")
    front = ("" if pd.isna(end.get("front_buffers")) else
             f" The same claim from the front of the index, as a worker's first claim of a "
             f"life reads it, read {_count(end['front_buffers'])} buffers in "
             f"{end['front_ms']:,.2f} ms at the end of {end['phase']}"
             + ("." if not end["take_buffers"] else
                f", {end['front_buffers'] / end['take_buffers']:,.0f} times the floor's "
                "buffers."))
    ledger = ("" if pd.isna(end.get("ledger_buffers")) or pd.isna(base.get("ledger_buffers"))
              else f" A lane's write to the batch ledger (`record_batch`) read "
              f"{_count(base['ledger_buffers'])} buffers at the end of {base['phase']} and "
              f"{_count(end['ledger_buffers'])} at the end of {end['phase']} "
              f"({end['ledger_ms']:,.2f} ms).")
    return [f"jobqueue's claim (`take` from a lane's floor, run under EXPLAIN (ANALYZE, "
            f"BUFFERS) at each phase's end) read {_count(base['take_buffers'])} buffers in "
            f"{base['take_ms']:,.2f} ms at the end of {base['phase']} and "
            f"{_count(end['take_buffers'])} buffers in {end['take_ms']:,.2f} ms at the end of "
            f"{end['phase']}{_times(base['take_buffers'], end['take_buffers'])}{why}{share}."
            f"{front}{ledger}"]


def goal_lines(df: pd.DataFrame, timeline: pd.DataFrame) -> list[str]:
    """The issue's goal, against this run."""
    rows = system_rows(df, "jobqueue")
    if rows.empty:
        return []
    base, all_pinned = _baseline(rows), rows[rows["pinned"].astype(bool)]
    pinned = base_rate_pinned(rows)
    if pinned.empty or pd.isna(base["complete_p99_ms"]) or pinned["complete_p99_ms"].isna().all():
        return ["- Not measurable in this run: its phases carry no p99 (smoke size)."]
    held = all_pinned["seconds"].sum()
    arrived = pinned["arrivals"].sum() / pinned["seconds"].sum()
    size = ("" if held >= GOAL_PINNED_S and arrived >= 0.95 * GOAL_RATE else
            f" (this run: pinned {held:,.0f} s with jobs arriving at {arrived:,.0f} jobs/s "
            f"on average; the goal says {GOAL_PINNED_S:,.0f} s at {GOAL_RATE:,.0f})")
    worst = pinned.loc[pinned["complete_p99_ms"].idxmax()]
    ratio = worst["complete_p99_ms"] / base["complete_p99_ms"]
    lines = [f"- p99 within {GOAL_FACTOR:g}× its own baseline while pinned{size}: worst "
             f"{_ms(worst['complete_p99_ms'])} ms in {worst['phase']} against "
             f"{_ms(base['complete_p99_ms'])} ms, {ratio:,.1f}×: "
             f"{'met' if ratio <= GOAL_FACTOR else 'not met'}."]
    for _, r in all_pinned[all_pinned["load"].notna()].iterrows():
        lines.append(f"- Not part of that goal, the pinned phase at {r['load']:g}× load "
                     f"({r['rate']:,.0f} jobs/s): p99 {_ms(r['complete_p99_ms'])} ms, "
                     f"{r['complete_p99_ms'] / base['complete_p99_ms']:,.1f}× the baseline's.")
    others = [s for s in systems(df) if s != "jobqueue"]
    if others:
        parts, ok = [], True
        for _, r in pinned.iterrows():
            theirs = df[(df["system"].isin(others)) & (df["phase"] == r["phase"])]
            theirs = theirs[theirs["complete_p99_ms"].notna()]
            if theirs.empty:
                continue
            best = theirs.loc[theirs["complete_p99_ms"].idxmin()]
            ok &= bool(r["complete_p99_ms"] < best["complete_p99_ms"])
            parts.append(f"{r['phase']} {_ms(r['complete_p99_ms'])} against "
                         f"{SYSTEM_NAMES[best['system']]}'s {_ms(best['complete_p99_ms'])} ms")
        if parts:
            lines.append(f"- Below every peer's p99 while pinned: {'; '.join(parts)}: "
                         f"{'met' if ok else 'not met'}.")
    back = recovery_seconds(timeline, df, "jobqueue")
    lines.append(f"- Back to baseline within {GOAL_RECOVERY_S:g} s of the release: "
                 + ("no window carries a p99 to tell by." if back is None else
                    "not back by the end of the run: not met." if math.isinf(back) else
                    f"{back:,.0f} s: {'met' if back <= GOAL_RECOVERY_S else 'not met'}."))
    return lines


def limits(results: Path) -> list[str]:
    """What the pressure run could not do, for BENCHMARKS.md's limits (none
    without its results)."""
    if not (results / "pressure.csv").exists():
        return []
    df, _ = load("pressure", results)
    lines = []
    capped = df[df["capped"].astype(bool)]
    if len(capped):
        lines.append(
            "- The pressure run's load phase is capped at what one producer process sends "
            f"({capped['rate'].max():,.0f} jobs/s): for "
            + " and ".join(dict.fromkeys(SYSTEM_NAMES[x] for x in capped["system"]))
            + " that is less than 1.5× what their worker drains.")
    held = df[df["pinned"].astype(bool)].groupby("system")["seconds"].sum()
    if len(held) and held.max() < GOAL_PINNED_S:
        lines.append(f"- The pressure run pins the horizon for {held.max():,.0f} s, not the "
                     f"{GOAL_PINNED_S / 60:g} minutes of the issue's goal (a full run of three "
                     "systems that long would take over half an hour).")
    return lines
