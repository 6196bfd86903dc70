"""The recovery measurement itself works (tiny: one trial per signal)."""

from __future__ import annotations

import signal
import uuid

from jobqueue.benchmarks.quick import drop_bench_database, prepare_database
from jobqueue.benchmarks.recovery import recovery_trial, summary_table


async def test_one_trial_per_signal(server_url: str, tmp_path) -> None:
    name = f"jobqueue_bench_{uuid.uuid4().hex[:8]}"
    url = await prepare_database(server_url, name)
    try:
        crash = await recovery_trial(url, signal.SIGKILL, lease=1.0, jobs=400, log_dir=tmp_path)
        hang = await recovery_trial(url, signal.SIGSTOP, lease=1.0, jobs=400, log_dir=tmp_path)
    finally:
        await drop_bench_database(url, name)
    assert 0 < crash["seconds"] < hang["seconds"]
    assert hang["seconds"] >= 1.0 - 0.25  # the lease, less at most one heartbeat interval
    table = summary_table([crash, hang])
    assert "| SIGKILL | 1 |" in table and "| SIGSTOP | 1 |" in table
