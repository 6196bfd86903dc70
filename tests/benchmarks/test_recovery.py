"""The recovery measurement itself works (tiny: one trial per signal)."""

from __future__ import annotations

import signal

from jobqueue.benchmarks.recovery import recovery_trial, summary_table


async def test_one_trial_per_signal(bench_database: str, tmp_path) -> None:
    url = bench_database
    crash = await recovery_trial(url, signal.SIGKILL, lease=1.0, jobs=400, log_dir=tmp_path)
    hang = await recovery_trial(url, signal.SIGSTOP, lease=1.0, jobs=400, log_dir=tmp_path)
    assert 0 < crash["seconds"] < hang["seconds"]
    assert hang["seconds"] >= 1.0 - 0.25  # the lease, less at most one heartbeat interval
    table = summary_table([crash, hang])
    assert "| SIGKILL | 1 |" in table and "| SIGSTOP | 1 |" in table
