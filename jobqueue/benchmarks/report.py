"""Render BENCHMARKS.md and its plots from the results files:
`python -m jobqueue.benchmarks.report` (the last step of `make bench`).

Every number in the document is read from `notebooks/benchmarks/results/*.csv`
and shown in a table, with a flag where a figure needs one; what each table
measures, and how, is quoted from the notebook that measures it (`note`).
"""

from __future__ import annotations

import argparse
import functools
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
import pandas as pd

from jobqueue.benchmarks import context as results_context
from jobqueue.benchmarks import load, peers, plots, pressure, run_record

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


# -- what each table measures, and how: said once, in the notebook that measures it --

NOTEBOOKS = CHECKOUT / "notebooks" / "benchmarks"


@functools.cache
def notes() -> dict[str, str]:
    """The notebooks' Markdown cells tagged `note:<name>`, without their heading:
    the explanations a reader of the notebook and of BENCHMARKS.md both need."""
    found = {}
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            for tag in cell["metadata"].get("tags", []):
                if tag.startswith("note:"):
                    found[tag[5:]] = re.sub(r"^#+ .*\n+", "", "".join(cell["source"])).strip()
    return found


def note(name: str) -> str:
    return notes()[name]


# -- the sections --------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    """A (sub)section: its heading, the paragraphs above its table (the note
    `name` unless `text` says otherwise), the table, the notes `between` it and
    the configurations run (`configured`), the figures and the notes `after`.
    Every function is given the frames of `files`, loaded; a part whose first
    file is missing is left out."""
    heading: str | Callable[..., str]
    name: str
    files: tuple[str, ...]
    table: Callable[..., pd.DataFrame]
    figures: tuple[tuple[str, Callable[..., Any]], ...] = ()
    fmt: str = ",.0f"
    text: Callable[..., list[str]] | None = None
    between: tuple[str, ...] = ()
    configured: bool = False
    after: tuple[str, ...] = ()


def _paragraphs(texts: Any) -> list[str]:
    return [line for text in texts for line in (text, "")]


def _part(results: Path, part: Part) -> list[str]:
    if not (results / f"{part.files[0]}.csv").exists():
        return []
    frames = [load(name, results)[0] for name in part.files]
    heading = part.heading(*frames) if callable(part.heading) else part.heading
    text = part.text(results, *frames) if part.text else [note(part.name)]
    lines = [heading, "", *_paragraphs(text),
             plots.markdown(part.table(*frames), part.fmt), "",
             *_paragraphs(map(note, part.between))]
    if part.configured:
        lines += [*configuration_notes(frames[0]), ""]
    return (lines + _paragraphs(_figure(fn(*frames), name, results) for name, fn in part.figures)
            + _paragraphs(map(note, part.after)))


def _section(results: Path, *parts: Part, intro: Sequence[str] = ()) -> str:
    return "\n".join([*intro, *(line for p in parts for line in _part(results, p))]).rstrip("\n")


def _recovery_text(_: Path, times: pd.DataFrame, *__: Any) -> list[str]:
    return ["The active worker is killed (SIGKILL) or frozen (SIGSTOP) while it works through a "
            "stream of jobs; both workers run "
            f"`jobqueue worker {plots.recovery_common_flags(times, 'argv')}` plus the setup's "
            f"own flags. {note('recovery')}"]


def _failover_text(_: Path, times: pd.DataFrame, *__: Any) -> list[str]:
    return [note("failover"),
            f"Here the worker ran `jobqueue worker {times['argv'].iloc[0]}`, through "
            f"{int(times['jobs'].iloc[0]):,} jobs of {times['job_ms'].iloc[0]:g} ms a trial."]


def _pressure_text(results: Path, df: pd.DataFrame, *_: Any) -> list[str]:
    context = results_context("pressure", results)
    return [note("pressure"),
            f"This run: {', '.join(plots.SYSTEM_NAMES[s] for s in plots.systems(df))}; load "
            f"capped at {context.get('pressure_max_rate', '?')} jobs/s, the first "
            f"{context.get('pressure_warmup', '?')} s left out, wait events sampled every "
            f"{context.get('pressure_interval', '?')} s, the figure's windows "
            f"{context.get('pressure_window', '?')} s."]


def _1(fn: Callable[[pd.DataFrame], Any]) -> Callable[..., Any]:
    return lambda df, *_: fn(df)  # of the part's first file only


def _2(fn: Callable[[pd.DataFrame], Any]) -> Callable[..., Any]:
    return lambda _, other: fn(other)  # of its second file only


#: The comparison's drain results, one file per workload (what the jobs do).
COMPARISON_DRAINS = (("comparison_drain", "noop"), ("comparison_write_row", "write_row"),
                     ("comparison_process_payment", "process_payment"))
PARTS = {part.name: part for part in (
    Part("## Throughput", "throughput", ("throughput_matrix",), plots.throughput_table,
         (("throughput", plots.throughput_plot),)),
    Part("### Does cost grow with the table?", "table_size", ("throughput_table_size",),
         plots.table_size_table, (("table_size", plots.table_size_plot),)),
    Part("### A long run: does the table stay healthy?", "soak",
         ("throughput_soak", "throughput_soak_timeline"), _1(plots.soak_table),
         (("soak", _2(plots.soak_plot)),), ",.1f"),
    Part("### Jobs that do something", "work", ("throughput_work",), plots.work_table),
    Part("### Queues and priorities", "routing",
         ("throughput_routing", "throughput_routing_spans"), _1(plots.routing_table),
         (("routing", plots.routing_plot),)),
    Part("### Sync handlers beside async ones", "sync", ("throughput_sync",), plots.sync_table),
    Part("## Latency", "latency", ("latency", "latency_samples"), plots.latency_table,
         (("latency", plots.latency_plot), ("latency_histogram", _2(plots.latency_histogram))),
         ",.1f"),
    Part("## Dead-worker recovery", "recovery", ("recovery", "recovery_timeline"),
         _1(plots.recovery_table), (("recovery_timeline", plots.recovery_timeline_plot),
                                    ("recovery_times", _1(plots.recovery_times_plot))),
         ",.3f", _recovery_text),
    Part("### PostgreSQL failover", "failover",
         ("recovery_failover", "recovery_failover_timeline"), _1(plots.failover_table),
         (("recovery_failover_timeline", plots.failover_timeline_plot),), ",.3f", _failover_text),
    *(Part(lambda df: f"### Draining {plots.usual_n(df):,} "
                      f"{plots.WORKLOADS[plots.workload(df)]}", name, (name,),
           plots.peer_drain_table, ((name, plots.peer_drain_plot),),
           text=lambda *_: [note("drain")], configured=True,
           after=("per_job_commits",) if handler == "noop" else ())
      for name, handler in COMPARISON_DRAINS),
    Part("### Latency under open-loop arrivals", "peer_latency",
         ("comparison_latency", "comparison_latency_samples"), _1(plots.peer_latency_table),
         (("comparison_latency", _1(plots.peer_latency_plot)),
          ("comparison_latency_cdf", _2(plots.peer_latency_cdf))), ",.1f", configured=True,
         after=("pgqueuer_buffer",)),
    Part("### Memory over a long drain", "memory",
         ("comparison_memory", "comparison_memory_timeline"), _1(plots.peer_memory_table),
         (("comparison_memory", _2(plots.peer_memory_plot)),), ",.2f", configured=True),
    Part("## Under pressure: vacuum held back", "pressure", ("pressure", "pressure_timeline"),
         plots.pressure_table, (("pressure", plots.pressure_plot),), ",.1f", _pressure_text,
         between=("pressure_goal",), configured=True),
)}


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
    versions = ", ".join(f"{plots.SYSTEM_NAMES[k.removesuffix('_version')]} {v}"
                         for k, v in results_context("comparison_drain", results).items()
                         if k.endswith("_version"))
    return _section(results, *(PARTS[name] for name in (
        *(name for name, _ in COMPARISON_DRAINS), "peer_latency", "memory")), intro=[
        "## Beside its peers: PgQueuer, Procrastinate, oban-py, graphile-worker and the "
        "course's design", "", note("peers"), "", f"Versions: {versions or 'unknown'}.", ""])


def _pressure(results: Path) -> str:
    """The queues while vacuum is held back (`pressure.ipynb`), the pinned
    goal, and jobqueue's claim."""
    df = load("pressure", results)[0]
    probes = plots.probe_table(df)
    goals = pressure.goal_rows(df.to_dict("records"))
    return _section(results, PARTS["pressure"]) + ("" if not goals else "\n".join([
        "", "", note("pressure_pinned"), "", plots.markdown(plots.pinned_goal_table(goals))])
    ) + ("" if probes.empty else "\n".join([
        "", "", "jobqueue's claim at the end of each phase (EXPLAIN (ANALYZE, BUFFERS) of `take`, "
        "as a lane sends it, in a transaction rolled back):", "", plots.markdown(probes)]))


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


def _scale(results: Path) -> str:
    """The queue at scale (`scale.ipynb`, `make bench-scale`): the table
    built, the operator's reads on it, drains beside its backlog, and a
    migration under traffic."""
    built = load("scale_build", results)[0].iloc[0]
    reads = load("scale_reads", results)[0]
    drains = load("scale_drains", results)[0]
    by = drains.groupby(["table", "flags"], sort=False)
    drained = pd.DataFrame({
        "jobs/s (median)": by["jobs_per_sec"].median(),
        "÷ empty (median)": by["÷ empty"].median().map(
            lambda x: "" if pd.isna(x) else f"{x:.2f}"),
        "runs": by["run"].count(), "autovacuums": by["autovacuums"].sum()}).reset_index()
    if "finished in" in reads:  # before and after the move to the history, side by side
        answers = reads.groupby("read", sort=False)["answer"].last()
        reads = reads.pivot(index="read", columns="finished in", values="ms").reindex(
            index=answers.index, columns=reads["finished in"].unique()).rename(
            columns=lambda c: f"ms, finished in {c}")
        reads = reads.assign(**{"answer (last)": answers}).reset_index()
    else:
        reads = reads.rename(columns={"ms": "ms (median)"})
    lines = ["## At scale: a week of history and another service's backlog", "",
             f"`make bench-scale` (`notebooks/benchmarks/scale.ipynb`): {int(built['finished']):,} "
             f"finished jobs and {int(built['waiting']):,} waiting of another service's types; "
             f"the table came to {built['heap_mib']:,.0f} MiB of heap and "
             f"{built['indexes_mib']:,.0f} MiB of indexes. {note('scale_build')}", ""]
    if (results / "scale_retention.csv").exists():
        retention = load("scale_retention", results)[0]
        sizes = load("scale_sizes", results)[0]
        lines += [note("scale_history"), "",
                  plots.markdown(retention.drop(columns=["run"], errors="ignore"), ",.1f"), "",
                  plots.markdown(sizes.drop(columns=["run"], errors="ignore"), ",.0f"), ""]
    lines += [note("scale_reads"), "", plots.markdown(reads, ",.1f"), "",
              note("scale_drains"), "", plots.markdown(drained, ",.0f")]
    if (results / "scale_migration.csv").exists():
        migrated = load("scale_migration", results)[0].astype(object).fillna("").iloc[0]
        for end in ("from", "to"):  # revisions: 0005, not 5
            migrated[end] = f"{int(migrated[end]):04d}"
        lines += ["", note("scale_migration"), "",
                  plots.markdown(pd.DataFrame([migrated]), ",.1f")]
    return "\n".join(lines)


SECTIONS: dict[str, Callable[[Path], str]] = {
    "throughput_matrix": lambda results: _section(results, *(PARTS[name] for name in (
        "throughput", "table_size", "soak", "work", "routing", "sync"))),
    "latency": lambda results: _section(results, PARTS["latency"]),
    "recovery": lambda results: _section(results, PARTS["recovery"], PARTS["failover"]),
    "comparison_drain": _peers, "pressure": _pressure, "scale_reads": _scale,
    "ceiling": _ceiling}


# -- the headline table: jobqueue at its CLI defaults against each peer's best -------

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
    return plots._ms(value, ",.2f" if value < 10 else ",.1f")


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
    available = [(name, fn) for name, fn in SECTIONS.items() if (results / f"{name}.csv").exists()]
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
