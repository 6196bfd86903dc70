"""The recovery measurement itself works (toy size: one trial each), on the
quick path and on the rescue path, where the dead worker holds claimed jobs."""

from __future__ import annotations

import signal

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from jobqueue import db
from jobqueue.benchmarks import plots, recovery
from jobqueue.benchmarks.recovery import SETUPS, recovery_trial, run_counts


async def test_one_trial_per_signal(bench_url: str, tmp_path) -> None:
    url = bench_url
    crash = await recovery_trial(url, signal.SIGKILL, lease=1.0, jobs=400, log_dir=tmp_path)
    hang = await recovery_trial(url, signal.SIGSTOP, lease=1.0, jobs=400, log_dir=tmp_path)
    assert crash["path"] == hang["path"] == "quick batches"
    assert 0 < crash["started_s"] <= crash["seconds"] < hang["seconds"]
    assert hang["seconds"] >= 1.0 - 0.25  # the lease, less at most one heartbeat interval
    assert {p["worker"] for p in crash["timeline"]} == {"first", "second"}


@pytest.mark.parametrize(("setup", "sig"), [("claimed", signal.SIGKILL),
                                           ("slow", signal.SIGSTOP)])
async def test_a_rescue_trial_puts_back_every_held_job_once(bench_url: str, tmp_path,
                                                            setup: str, sig: signal.Signals
                                                            ) -> None:
    how = SETUPS[setup]
    trial = await recovery_trial(bench_url, sig, lease=1.0, jobs=400, flags=how.flags,
                                 job_seconds=how.job_seconds, log_dir=tmp_path)
    assert trial["path"] == "claimed"
    # There was something to rescue: claimed jobs of the dead worker, read at the signal...
    assert trial["held_processing"] > 0
    # ...and each came back and was completed by the standby, once.
    assert trial["held_completed_once"] == trial["held_processing"]
    assert trial["held_done_s"] >= trial["seconds"] > 0
    assert trial["left_processing"] == 0
    assert trial["completed"] > 0 and trial["completed_not_once"] == trial["ran_twice"] == 0


async def test_the_run_count_sees_a_job_run_twice(bench_url: str, tmp_path) -> None:
    await recovery_trial(bench_url, signal.SIGKILL, lease=1.0, jobs=200, log_dir=tmp_path)
    conn = await db.connect(bench_url)
    try:
        job = await conn.fetchrow("SELECT id, worker_id FROM jobs WHERE status = 'completed'"
                                  " LIMIT 1")
        before = await run_counts(conn, [job["id"]], job["worker_id"])
        assert before["held_completed_once"] == 1 and before["ran_twice"] == 0
        await conn.execute("INSERT INTO recovery_runs (job_id) VALUES ($1)", job["id"])
        after = await run_counts(conn, [job["id"]], job["worker_id"])
    finally:
        await conn.close()
    assert after["held_completed_once"] == 0
    assert after["ran_twice"] == after["completed_not_once"] == 1


def test_the_path_is_read_from_the_workers_options() -> None:
    paths = {name: recovery.path_of(recovery.worker_argv(2.0, 10, s.flags), s.job_seconds)
             for name, s in SETUPS.items()}
    assert paths == {"quick": "quick batches", "claimed": "claimed", "slow": "claimed"}
    table = recovery.setups_table(list(SETUPS), 2.0)
    assert list(table["path"]) == list(paths.values())
    assert "--quick-batch 0" in table.loc[table["setup"] == "claimed", "command"].iloc[0]


CLAIMED = "--batch-size 10 --lease 2 --quick-batch 0"


def _trials(**changes: object) -> pd.DataFrame:
    """Two made-up claimed-path trials and one quick-path one, as a results file has them."""
    rows = [
        {"setup": "quick", "path": "quick batches", "flags": "--batch-size 10 --lease 2",
         "job_ms": 5.0, "signal": "SIGKILL", "seconds": 0.05, "started_s": 0.03, "lease": 2.0,
         "held_processing": 0, "held_done_s": None, "held_completed_once": 0,
         "left_processing": 0, "completed": 30, "completed_not_once": 0, "trial": 1},
        {"setup": "claimed", "path": "claimed", "flags": CLAIMED,
         "job_ms": 5.0, "signal": "SIGKILL", "seconds": 0.08, "started_s": 0.04, "lease": 2.0,
         "held_processing": 20, "held_done_s": 0.09, "held_completed_once": 20,
         "left_processing": 0, "completed": 40, "completed_not_once": 0, "trial": 1},
        {"setup": "claimed", "path": "claimed", "flags": CLAIMED,
         "job_ms": 5.0, "signal": "SIGSTOP", "seconds": 2.1, "started_s": 2.0, "lease": 2.0,
         "held_processing": 10, "held_done_s": 2.2, "held_completed_once": 10,
         "left_processing": 0, "completed": 40, "completed_not_once": 0, "trial": 1},
    ]
    df = pd.DataFrame(rows)
    for key, value in changes.items():
        df.loc[df["setup"] == "claimed", key] = value
    return df


def test_the_table_follows_the_trials() -> None:
    bad = plots.recovery_table(_trials(held_completed_once=5, left_processing=3))
    assert list(bad["held jobs completed once"]) == ["0 of 0", "5 of 20", "5 of 10"]
    assert list(bad["left processing"]) == ["0", "3", "3"]
    table = plots.recovery_table(_trials())
    assert list(table["left processing"]) == ["0", "0", "0"]
    assert list(table["setup"]) == ["quick batches, 5 ms jobs",
                                    "claimed, 5 ms jobs, `--quick-batch 0`",
                                    "claimed, 5 ms jobs, `--quick-batch 0`"]
    assert list(table["held jobs completed once"]) == ["0 of 0", "20 of 20", "10 of 10"]


def _failovers(**changes: object) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Three made-up failover trials and their timelines, as results files have them."""
    rows = [{"trial": n, "jobs": 300, "job_ms": 5.0, "lease": 1.0, "replication": "sync",
             "flags": "--batch-size 10 --lease 1", "resume_s": resume, "promoted_s": 0.15,
             "promotion_s": promotion, "after_promotion_s": resume - 0.15,
             "completed_before": 50, "kept_before": 50, "completed": 300,
             "completed_not_once": 0, "ran_twice": 0, "argv": "--lease 1"}
            for n, resume, promotion in ((1, 0.4, 0.12), (2, 0.3, 0.10), (3, 0.5, 0.14))]
    times = pd.DataFrame(rows)
    for key, value in changes.items():
        times.loc[times["trial"] == 2, key] = value
    timeline = pd.DataFrame([{"trial": n, "server": server, "t": t, "jobs": 10}
                             for n in (1, 2, 3)
                             for server, t in (("old primary", -0.1), ("new primary", 0.3))])
    return times, timeline


def test_the_failover_table_follows_the_trials() -> None:
    times, timeline = _failovers()
    good = plots.failover_table(times).iloc[0]
    assert good["completed before the kill, kept"] == "150 of 150"
    assert good["kill → first job on the new primary, median (s)"] == 0.4
    assert (good["min (s)"], good["max (s)"], good["promotion, max (s)"]) == (0.3, 0.5, 0.14)
    assert (good["replication"], good["jobs completed"]) == ("sync", "900 of 900")
    bad = plots.failover_table(_failovers(kept_before=40, completed_not_once=2, ran_twice=1,
                                          completed=290, replication="async")[0]).iloc[0]
    assert bad["completed before the kill, kept"] == "140 of 150"
    assert (bad["jobs not run exactly once"], bad["ran twice"]) == (2, 1)
    assert (bad["replication"], bad["jobs completed"]) == ("async, sync", "890 of 900")
    figure = plots.failover_timeline_plot(times, timeline)
    assert "0.400 s" in figure.axes[0].get_title()  # the median trial's
    plt.close(figure)


def test_the_report_has_a_failover_part_once_there_are_results(tmp_path, monkeypatch) -> None:
    from jobqueue.benchmarks import report, save

    monkeypatch.setattr("jobqueue.benchmarks.results_dir", lambda: tmp_path)
    save(_trials().assign(argv=lambda d: d["flags"]).to_dict("records"), "recovery", {})
    save([{"setup": "quick", "signal": "SIGKILL", "trial": 1, "worker": "second", "t": 0.0,
           "jobs": 3}], "recovery_timeline", {})
    without = report.SECTIONS["recovery"](tmp_path)
    assert "### PostgreSQL failover" not in without
    times, timeline = _failovers()
    save(times.to_dict("records"), "recovery_failover", {})
    save(timeline.to_dict("records"), "recovery_failover_timeline", {})
    text = report.SECTIONS["recovery"](tmp_path)
    assert "### PostgreSQL failover" in text and "| 3 | 0.400 |" in text
    assert (tmp_path / "recovery_failover_timeline.png").stat().st_size > 0
