"""The table BENCHMARKS.md and the README's performance block open with:
jobqueue as the README starts it against each peer's best, on the workloads
a reader asks about first, with the ratio, a flag where a figure needs one,
and the run each row comes from.

jobqueue's side is always one `jobqueue worker --import MODULE` process at
the CLI's defaults (what a user runs first); each peer's is its best setup
in the same run, whatever its number of processes: the comparison the
project holds itself to. The detailed sections of BENCHMARKS.md have every
setup, like for like.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from jobqueue.benchmarks import context as results_context
from jobqueue.benchmarks import load, peers, plots

#: The comparison's drain results, one file per workload (what the jobs do).
COMPARISON_DRAINS = (("comparison_drain", "noop"), ("comparison_write_row", "write_row"),
                     ("comparison_process_payment", "process_payment"))
LEAD = "lead (×)"
#: What the table's columns mean, said once above it.
LEGEND = (f"`{LEAD}`: jobqueue's figure over the peer's for a drain (jobs/s), the peer's over "
          "jobqueue's for a latency (ms); above 1, jobqueue is ahead. jobqueue runs as the "
          "README starts it (one process, the CLI's defaults); each peer at its best setup of "
          "the run, named beside its figure. Medians of each setup's rounds.")


def best(rows: pd.DataFrame) -> pd.Series | None:
    """The setup with the highest median (None when there is none)."""
    return None if rows.empty else rows.loc[rows["median"].idxmax()]


def _run(results: Path, name: str) -> str:
    stamp = results_context(name, results)
    return f"{stamp.get('run', '?')[:16].replace('T', ' ')}, `{stamp.get('commit', '?')[:8]}`"


def _drain_rows(results: Path, name: str, handler: str) -> list[dict[str, Any]]:
    s = plots.peer_drain_spread(load(name, results)[0])
    ours = best(s[(s["system"] == "jobqueue") & (s["preset"] == peers.CLI_DEFAULTS)])
    if ours is None:
        return []
    rows, run = [], _run(results, name)
    for system in peers.PEERS:
        theirs = best(s[s["system"] == system])
        if theirs is None:
            continue
        flags = []
        if theirs["n"] != ours["n"]:
            flags.append(f"{plots.SYSTEM_NAMES[system]} drained {theirs['n']:,} jobs, "
                         f"jobqueue {ours['n']:,}")
        if theirs["runs"] < 2 or ours["runs"] < 2:
            flags.append("one round")
        rows.append({"workload": f"drain, {handler} (jobs/s)",
                     "jobqueue": f"{ours['median']:,.0f}",
                     "peer": f"{plots.SYSTEM_NAMES[system]}: {theirs['median']:,.0f} "
                             f"({plots.short_settings(theirs['settings'])})",
                     LEAD: ours["median"] / theirs["median"], "flag": "; ".join(flags),
                     "run": run})
    return rows


def _ms(value: float) -> str:
    """Milliseconds to two decimals under 10 ms (a goal of 1.5 ms must not
    read as met by rounding), one above."""
    return "–" if pd.isna(value) else f"{value:,.{2 if value < 10 else 1}f}"


def _latency_rows(results: Path) -> list[dict[str, Any]]:
    med = plots.peer_latency_runs(load("comparison_latency", results)[0])
    low = med[med["rate"] == med["rate"].min()]
    ours = low[low["system"] == "jobqueue"]
    if ours.empty:
        return []
    mine = ours.iloc[0]
    rows, run = [], _run(results, "comparison_latency")
    for system in peers.PEERS:
        found = low[low["system"] == system]
        if found.empty:
            continue
        theirs = found.iloc[0]
        flags = [f"{who}: {flag}" for who, flag in (
            ("jobqueue", plots.latency_flag(mine)),
            (plots.SYSTEM_NAMES[system], plots.latency_flag(theirs))) if flag != "met"]
        for q in ("50", "99"):
            column = f"complete_p{q}_ms"
            lead = theirs[column] / mine[column]
            rows.append({"workload": f"enqueue → completion p{q} at {mine['rate']:,.0f} jobs/s "
                                     "(ms)",
                         "jobqueue": _ms(mine[column]),
                         "peer": f"{plots.SYSTEM_NAMES[system]}: {_ms(theirs[column])} "
                                 f"({theirs['settings']})",
                         LEAD: float("nan") if pd.isna(lead) else lead,
                         "flag": "; ".join(flags) or ("" if not pd.isna(lead)
                                                      else "the sample does not carry it"),
                         "run": run})
    return rows


def table(results: Path) -> pd.DataFrame:
    """Every headline row the results in `results` can give (empty when the
    comparison has not run)."""
    rows = []
    for name, handler in COMPARISON_DRAINS:
        if (results / f"{name}.csv").exists():
            rows += _drain_rows(results, name, handler)
    if (results / "comparison_latency.csv").exists():
        rows += _latency_rows(results)
    return pd.DataFrame(rows)


def markdown(results: Path) -> list[str]:
    """The legend and the table as Markdown lines ([] without results)."""
    found = table(results)
    if found.empty:
        return []
    found[LEAD] = found[LEAD].map(lambda v: "–" if pd.isna(v) else f"{v:,.2f}")
    legend = LEGEND
    if found["run"].nunique() == 1:  # said once rather than on every row
        legend += f" Every row is from the run started {found['run'].iloc[0]}."
        found = found.drop(columns="run")
    return [legend, "", plots.markdown(found)]
