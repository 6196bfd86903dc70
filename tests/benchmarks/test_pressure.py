"""The pressure benchmark at toy size: a real jobqueue worker process, a real
holder and real REPEATABLE READ readers pinning the horizon, checked from
outside with VACUUM; the rows, labels and report that come out."""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from jobqueue import db
from jobqueue.benchmarks import load, peers, pinned, plots, pressure, save, scenarios
from jobqueue.benchmarks.report import render
from jobqueue.ops import horizon
from jobqueue.testing import wait_for

PHASES = [{"name": "baseline", "seconds": 1.5},
          {"name": "holder", "seconds": 2, "holder": True},
          {"name": "readers", "seconds": 2, "holder": True, "readers": 2},
          {"name": "recovery", "seconds": 1.5}]


async def _dead_after_vacuum(conn: asyncpg.Connection) -> int:
    """What VACUUM could not remove from jobs: dead versions someone may still see."""
    await conn.execute("VACUUM jobs")
    return int(await conn.fetchval(
        "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'jobs'"))


async def _watch(conn: asyncpg.Connection) -> dict[str, Any]:
    """From outside the run: the holder named as the horizon's, what VACUUM
    leaves while it holds, the readers with their snapshots."""
    async def held() -> horizon.Holder | None:
        h = await horizon.oldest(conn)
        return h if h is not None and (h.name, h.state) == (
            pressure.HOLDER, "idle in transaction") else None

    seen: dict[str, Any] = {"holder": await wait_for(held, timeout=60, message="the holder")}
    seen["holder_session"] = await conn.fetchrow(
        "SELECT state, backend_xid IS NOT NULL AS has_xid FROM pg_stat_activity"
        " WHERE application_name = $1", pressure.HOLDER)
    seen["dead_held"] = await wait_for(lambda: _dead_after_vacuum(conn), timeout=30,
                                       interval=0.2, message="a job finished since the hold")

    async def readers() -> list[asyncpg.Record] | None:
        rows = await conn.fetch(
            "SELECT state FROM pg_stat_activity WHERE application_name = $1"
            " AND backend_xmin IS NOT NULL AND backend_xid IS NULL", pressure.READER)
        return rows if len(rows) == 2 else None

    seen["readers"] = await wait_for(readers, timeout=30, message="two RR readers")

    async def more() -> int:
        dead = await _dead_after_vacuum(conn)
        return dead if dead > seen["dead_held"] else 0

    seen["dead_later"] = await wait_for(more, timeout=30, interval=0.2,
                                        message="VACUUM leaving more dead versions")
    return seen


async def test_a_run_pins_the_horizon_only_while_its_holder_and_readers_are_there(
        bench_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("jobqueue.benchmarks.results_dir", lambda: tmp_path)
    config = pressure.Config(phases=pressure.phases(PHASES), rate=40, sustained={"jobqueue": 500},
                             window=0.5, warmup=0.2, settle=60)
    conn = await db.connect(bench_url)
    try:
        result, seen = await asyncio.gather(
            pressure.run("jobqueue", bench_url, {"flags": []}, config), _watch(conn))
        assert tuple(seen["holder_session"]) == ("idle in transaction", True)
        # While held, VACUUM leaves the finished jobs' versions, more and more of them.
        assert 0 < seen["dead_held"] < seen["dead_later"]
        assert {r["state"] for r in seen["readers"]} <= {"active", "idle in transaction"}
        assert await horizon.oldest(conn) is None  # released: nothing holds it now
        assert await _dead_after_vacuum(conn) == 0  # and VACUUM takes every one of them
        context = {**await scenarios.environment(bench_url), **pressure.settings_of(config)}
    finally:
        await conn.close()

    rows = result["rows"]
    assert [r["phase"] for r in rows] == [p["name"] for p in PHASES]
    assert all(r["arrivals"] > 0 and r["completed_per_s"] > 0 for r in rows)
    assert [r["holder_share"] for r in rows] == [0, 1, 1, 0]
    assert [r["readers_seen"] for r in rows] == [0, 0, 2, 0]
    assert [r["horizon"] == pressure.HOLDER for r in rows] == [False, True, True, False]
    assert all(r["rate"] == 40 and r["take_buffers"] > 0 for r in rows)
    # The probe sends the claim the worker sends: an arm for each of its types.
    assert {r["take_arms"] for r in rows} == {3}  # noop, sleep, write_row
    assert all(0 < r["late_jobs"] <= r["arrivals"] for r in rows)
    [goal] = pressure.goal_rows(rows)
    assert (goal["phase"], goal["late_p99_ms"]) == ("holder", rows[1]["late_p99_ms"])
    for r in rows:  # the label is read back from the arguments the worker got
        assert r["argv"] == "--import jobqueue.benchmarks.handlers"
        assert r["settings"] == peers.label("jobqueue", shlex.split(r["argv"]))
        assert r["settings"].startswith("CLI defaults")
    assert {t["phase"] for t in result["timeline"]} == {p["name"] for p in PHASES}
    assert {w["phase"] for w in result["waits"]} <= {p["name"] for p in PHASES}

    save(rows, "pressure", context)
    save(result["timeline"], "pressure_timeline", context)
    text = render(tmp_path, tmp_path / "BENCHMARKS.md").read_text()
    assert "## Under pressure" in text and "| jobqueue | holder | 2" in text
    assert "issue's goal for jobqueue" in text
    assert "The promise jobqueue makes (issue 49)" in text and "| within 1.5× |" in text
    assert (tmp_path / "pressure.png").stat().st_size > 0


def test_phases_are_data_checked_and_rates_follow_them() -> None:
    with pytest.raises(ValueError, match="phase 2: needs name and seconds"):
        pressure.phases([{"name": "a", "seconds": 1}, {"name": "b", "sconds": 1}])
    with pytest.raises(ValueError, match="'b': seconds and load must be positive"):
        pressure.phases([{"name": "b", "seconds": 1, "load": 0}])
    base, load = pressure.phases(pressure.with_seconds(
        [{"name": "base", "seconds": 9}, {"name": "load", "seconds": 9, "load": 1.5}], 2))
    assert (base.seconds, load.seconds, load.pinned) == (2, 2, False)
    config = pressure.Config(phases=(base, load), rate=500, max_rate=1000, base_share=0.7)
    assert [config.rate_of(p, 30_000) for p in (base, load)] == [500, 1000]  # capped
    assert [config.rate_of(p, 200) for p in (base, load)] == [140, 300]  # a slow system


async def test_a_producer_that_falls_behind_drops_arrivals_rather_than_sending_them_late() -> None:
    release = asyncio.Event()
    sent = []

    async def enqueue_one() -> None:
        sent.append(1)
        await release.wait()  # the server is slow: nothing comes back yet

    sender = pressure._Sender(enqueue_one, counts=[3, 2], rates=[2, 1], max_behind=1.0)
    calls = [asyncio.create_task(sender()) for _ in range(5)]
    await asyncio.sleep(0)
    assert len(sent) == 2 and sender.dropped == [1, 2]  # a second's worth waits: 2, then 1
    release.set()
    await asyncio.gather(*calls)
    assert sender.pending == 0


def test_the_goal_is_judged_at_the_base_rate_and_the_load_phase_said_apart() -> None:
    """The goal is p99 within 3× baseline while pinned at 500 jobs/s: the
    pinned phase of extra load is shown beside it, not judged with it."""
    import pandas as pd

    def row(order: int, phase: str, p99: float, pinned: bool, load: float | None = None
            ) -> dict[str, Any]:
        return {"system": "jobqueue", "order": order, "phase": phase, "seconds": 300.0,
                "start_s": 300.0 * (order - 1), "end_s": 300.0 * order,
                "pinned": pinned, "load": load, "rate": 500.0 * (load or 1),
                "arrivals": 150_000 * (load or 1), "complete_p99_ms": p99,
                "achieved_rate": 500.0 * (load or 1), "completed_per_s": 500.0 * (load or 1)}

    df = pd.DataFrame([row(1, "baseline", 10.0, False), row(2, "readers", 25.0, True),
                       row(3, "load", 90.0, True, 2.0), row(4, "recovery", 11.0, False)])
    timeline = pd.DataFrame([{"system": "jobqueue", "t": t, "phase": p, "complete_p99_ms": 9.0}
                             for t, p in ((0, "baseline"), (5, "baseline"), (900, "recovery"),
                                          (905, "recovery"))])
    flags = plots._pressure_flags(df, timeline)
    assert flags.tolist() == ["", "", "", "p99 back within baseline after 5 s"], flags
    df.loc[1, "complete_p99_ms"] = 31.0  # 3.1× the baseline's
    assert plots._pressure_flags(df, timeline)[1] == "goal missed: p99 over 3× baseline"
    late = timeline.assign(complete_p99_ms=[9.0, 9.0, 50.0, 50.0])
    assert plots._pressure_flags(df, late)[3] == (
        "p99 not back to baseline by the end (goal missed: 30 s)")


async def test_a_system_that_fails_leaves_the_systems_before_it_kept(bench_url: str) -> None:
    """The second system cannot even connect (its database is not there): the
    first's rows were handed to `keep` before the run failed."""
    if not peers.available("pgqueuer"):
        pytest.skip("pgqueuer is not installed")
    config = pressure.Config(phases=pressure.phases(PHASES[:1] + PHASES[-1:]), rate=40,
                             sustained={"jobqueue": 500, "pgqueuer": 500}, window=0.5,
                             warmup=0.2, settle=60)
    missing = bench_url.replace("/jobqueue_bench_", "/jobqueue_no_such_database_", 1)
    assert missing != bench_url
    kept: list[list[str]] = []
    with pytest.raises(asyncpg.InvalidCatalogNameError):
        await pressure.comparison(
            {"jobqueue": bench_url, "pgqueuer": missing},
            [{"system": "jobqueue", "flags": []}, {"system": "pgqueuer", "batch_size": 100}],
            config, lambda rows, timeline, waits: kept.append([r["system"] for r in rows]))
    assert kept == [["jobqueue", "jobqueue"]]  # its two phases, saved before the failure


def test_a_run_that_saw_no_wait_event_still_reads_back() -> None:
    """A short run can sample only idle backends (CI's did): its waits file
    must still load and tabulate, as an empty table."""
    idle = [{"at": 0.5, "waits": {}}, {"at": 1.0, "waits": {}}]  # samples of idle backends
    assert pressure.wait_rows(pressure.phases(pressure.PHASES), [0.0], idle) == []
    save([], "test_pressure_waits", {}, pressure.WAIT_COLUMNS)
    waits, _ = load("test_pressure_waits")
    assert list(waits.columns) == list(pressure.WAIT_COLUMNS)
    table = plots.waits_table(waits)
    assert table.empty and "wait events (samples)" in table.columns


def _phase(order: int, phase: str, p50: float, p99: float, late: tuple[float, float],
           **kw: Any) -> dict[str, Any]:
    return {"system": "jobqueue", "order": order, "phase": phase, "seconds": 120,
            "holder": False, "readers": 0, "load": None, "complete_p50_ms": p50,
            "complete_p99_ms": p99, "late_jobs": 20_000, "late_p50_ms": late[0],
            "late_p99_ms": late[1], **kw}


@pytest.mark.parametrize(("late", "met"), [((3.0, 9.0), True), ((3.1, 9.0), False),
                                           ((3.0, 9.1), False)])
def test_the_pinned_goal_is_each_quantile_late_in_the_hold_within_1_5x_the_baseline(
        late: tuple[float, float], met: bool) -> None:
    rows = [_phase(1, "baseline", 2.0, 6.0, (2.2, 7.0)),
            _phase(2, "holder", 4.0, 12.0, late, holder=True),
            _phase(3, "readers", 80.0, 200.0, (90.0, 300.0), holder=True, readers=4)]
    [goal] = pressure.goal_rows(rows)
    assert goal["phase"] == "holder" and goal["met"] is met
    assert goal["p50_ratio"] == pytest.approx(late[0] / 2.0)
    assert goal["p99_ratio"] == pytest.approx(late[1] / 6.0)
    assert ("met" if met else "MISSED") in pinned.verdict([goal])


def test_the_pinned_check_runs_at_the_rate_asked_through_its_phases() -> None:
    conf = pinned.config(rate=500, hold=120, baseline=50)
    assert [(p.name, p.seconds, p.holder) for p in conf.phases] == [
        ("baseline", 50, False), ("holder", 120, True), ("recovery", 10, False)]
    assert {conf.rate_of(p, conf.sustained["jobqueue"]) for p in conf.phases} == {500}
