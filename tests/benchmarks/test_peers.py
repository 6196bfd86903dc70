"""The comparison with peer queues, at toy size: real PostgreSQL, real worker
processes of each peer (and of jobqueue, started as the README starts it),
real resident-memory readings, real writes checked row by row."""

from __future__ import annotations

import math
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path

import pytest

from jobqueue import db
from jobqueue.benchmarks import graphile, peers, rss, save, scenarios
from jobqueue.benchmarks.report import render
from jobqueue.testing import wait_for
from jobqueue.worker import DEFAULT_BATCH_SIZE, DEFAULT_CONCURRENCY

TIMEOUT = 60


@pytest.fixture
async def peer_url(request: pytest.FixtureRequest, server_url: str) -> AsyncIterator[str]:
    """A database of the peer's own, its schema installed by its own API."""
    system = request.param
    if not peers.available(system):
        pytest.skip(f"{system} cannot run here")
    name = f"t{uuid.uuid4().hex[:8]}"
    url = await peers.open_peer(system, name)
    yield url
    await scenarios.close_bench(name)


#: Each peer's count of jobs completed, from its own tables.
DONE = {"pgqueuer": "SELECT count(DISTINCT job_id) FROM pgqueuer_log WHERE status = 'successful'",
        "procrastinate": "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'",
        "oban-py": "SELECT count(*) FROM oban_jobs WHERE state = 'completed' AND attempt = 1"}


@pytest.mark.parametrize(("peer_url", "setting"),
                         [("pgqueuer", {"batch_size": 10, "workers": 1}),
                          ("pgqueuer", {"batch_size": 50, "workers": 2}),
                          ("procrastinate", {"concurrency": 4, "workers": 1}),
                          ("oban-py", {"limit": 5, "workers": 2})],
                         indirect=["peer_url"])
async def test_each_peer_drains_every_job_with_real_processes(
        peer_url: str, setting: dict[str, int], request: pytest.FixtureRequest) -> None:
    system = request.node.callspec.params["peer_url"]
    row = await peers.drain(system, peer_url, n=200, **setting)
    assert row["system"] == system and row["n"] == 200
    assert row["seconds"] > 0 and row["jobs_per_sec"] > 0
    assert row["rss_peak_mib"] > 10  # a Python process, sampled while it worked
    conn = await db.connect(peer_url)
    try:  # every job done, seen in the peer's own tables (drain checks this too)
        if system == "pgqueuer":
            assert await conn.fetchval("SELECT count(*) FROM pgqueuer") == 0
        done = await conn.fetchval(DONE[system])
    finally:
        await conn.close()
    assert done == 200


@pytest.mark.parametrize("peer_url", ["pgqueuer", "procrastinate", "oban-py"], indirect=True)
@pytest.mark.serial  # it measures a schedule: another test's load beside it skews the clock
async def test_open_loop_latencies_of_a_peer_are_sane(peer_url: str, request) -> None:
    system = request.node.callspec.params["peer_url"]
    result = await peers.open_loop(system, peer_url, rate=20, seconds=0.5, warmup=0.25,
                                   setup={"concurrency": 2})
    summary = result["summary"]
    assert summary["system"] == system and summary["arrivals"] == 15  # 20/s for 0.75 s
    assert 0 < summary["jobs"] < 15  # the first 0.25 s of arrivals are not counted
    assert len(result["to_start"]) == len(result["to_complete"]) == summary["jobs"]
    for start, complete in zip(result["to_start"], result["to_complete"], strict=True):
        assert 0 <= start <= complete < 5  # seconds, on the database's clock
    assert summary["start_p50_ms"] <= summary["complete_p50_ms"]
    assert math.isnan(summary["complete_p99_ms"])  # a dozen jobs carry no p99
    assert summary["achieved_rate"] == pytest.approx(20, rel=0.3)


def test_a_percentile_is_reported_only_where_the_sample_carries_it() -> None:
    assert peers.carried(0.99, 100) and not peers.carried(0.99, 99)
    assert peers.carried(0.999, 1000) and not peers.carried(0.999, 999)
    # 100 jobs/s for 13 s, each started 1 ms and completed 2 ms after its enqueue,
    # but the first second's jobs ten times slower (a cold worker).
    times = [(i / 100, i / 100 + (0.01 if i < 100 else 0.001),
              i / 100 + (0.02 if i < 100 else 0.002)) for i in range(1300)]
    summary = peers.latency_summary(100, 12, [0.0] * 1300, times, warmup=1.0)
    assert (summary["arrivals"], summary["jobs"]) == (1300, 1200)
    assert summary["complete_p99_9_ms"] == pytest.approx(2.0)  # the cold second left out
    assert summary["rate_met"] and summary["kept_up"]
    few = peers.latency_summary(100, 1, [0.0] * 150, times[:150], warmup=1.0)
    assert few["jobs"] == 50 and few["complete_p50_ms"] == pytest.approx(2.0)
    assert math.isnan(few["complete_p99_ms"]) and math.isnan(few["complete_p99_9_ms"])
    # Asked 1,000 jobs/s, reached 100; completions at 50/s: both flagged.
    behind = [(i / 100, i / 100, i / 50) for i in range(300)]
    slow = peers.latency_summary(1000, 2, [0.0] * 300, behind, warmup=1.0)
    assert not slow["rate_met"] and not slow["kept_up"]
    assert slow["completed_rate"] == pytest.approx(50)


async def test_the_rss_sampler_reads_a_real_process() -> None:
    # A process that holds 64 MiB it has written to (so it is resident).
    code = "import sys; x = bytearray(64 << 20); print('ready', flush=True); sys.stdin.read()"
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        async with rss.RssSampler([proc.pid], interval=0.02) as sampler:
            await wait_for(lambda: len(sampler.samples) >= 3, timeout=TIMEOUT,
                           message="three samples")
        assert all(s["pid"] == proc.pid for s in sampler.samples)
        assert all(s["rss_mib"] > 64 for s in sampler.samples)
        summary = rss.summary(sampler.samples)
        assert summary["rss_peak_mib"] >= summary["rss_start_mib"] > 64
    finally:
        proc.communicate("", timeout=TIMEOUT)
    assert rss.rss_bytes(proc.pid) is None  # gone (reaped): no reading, no error


def test_rss_summary_reads_the_window_and_the_largest_process() -> None:
    samples = [{"t": t, "pid": pid, "rss_mib": mib}
               for t, pid, mib in [(0, 1, 10), (1, 1, 40), (2, 1, 45), (3, 1, 30),
                                   (1, 2, 20), (2, 2, 25)]]
    assert rss.summary(samples, start=1, end=2) == {
        "rss_start_mib": 40, "rss_peak_mib": 45, "rss_end_mib": 45}
    # A window too short to hold a sample has no start or end, only a peak.
    short = rss.summary(samples, start=1.2, end=1.3)
    assert math.isnan(short["rss_start_mib"]) and math.isnan(short["rss_end_mib"])
    assert short["rss_peak_mib"] == 45
    assert rss.timeline(samples, origin=1)[0]["t"] == -1


async def test_jobqueue_drains_report_memory_too(server_url: str) -> None:
    name = f"t{uuid.uuid4().hex[:8]}"
    async with scenarios.bench_database(name) as url:
        plain = await scenarios.drain(url, n=100, batch_size=50, workers=1, shared=False)
        assert "rss_peak_mib" not in plain  # unchanged unless asked for
        timeline = await scenarios.memory_timeline(url, n=300, batch_size=50)
    summary = timeline["summary"]
    assert summary["n"] == 300 and summary["rss_peak_mib"] > 10
    assert timeline["timeline"] and all(p["rss_mib"] > 0 for p in timeline["timeline"])


def test_settings_say_which_knobs_were_turned() -> None:
    lanes = f"{DEFAULT_CONCURRENCY} lanes"
    assert peers.settings({"system": "jobqueue", "flags": []}) == (
        "CLI defaults, as in the README (`jobqueue worker --import jobqueue.benchmarks.handlers`): "
        f"{lanes}, batch {DEFAULT_BATCH_SIZE}, INFO logs, 1 process")
    assert peers.settings({"system": "jobqueue", "flags": ["--shared"], "workers": 2},
                          "process_payment") == (
        "(`jobqueue worker --import jobqueue.lab.examples --shared` × 2): "
        f"{lanes} each, batch {DEFAULT_BATCH_SIZE}, INFO logs, 2 processes (shared)")
    # The older knobs become the flags they stand for, and the label says them.
    assert peers.settings({"system": "jobqueue", "batch_size": 50, "concurrency": 1}) == (
        "(`jobqueue worker --import jobqueue.benchmarks.handlers --batch-size 50 "
        "--concurrency 1`): 1 lane, batch 50, INFO logs, 1 process")
    assert peers.settings({"system": "pgqueuer"}) == "batch 10, 1 process"
    assert peers.settings({"system": "procrastinate", "concurrency": 5}) == (
        "concurrency 5, 1 process")
    assert peers.settings({"system": "graphile-worker", "workers": 4}) == (
        "concurrency 24, 4 processes, perfTest configuration")
    with pytest.raises(ValueError, match="unknown system"):
        peers.settings({"system": "celery"})


def test_labels_are_read_back_from_the_arguments_alone() -> None:
    # Each system's label parses the recorded argv with the parser its worker uses.
    assert peers.label("pgqueuer", "--batch-size 7", 2) == "batch 7, 2 processes"
    assert peers.label("pgqueuer", "") == "batch 10, 1 process"  # peer_worker's default
    assert peers.label("procrastinate", ["--concurrency", "3"]) == "concurrency 3, 1 process"
    assert peers.label("oban-py", "--queues default:7", 2) == (
        "limit 7, 2 processes, `oban start`")
    assert peers.label("graphile-worker", "concurrentJobs=3 maxPoolSize=4") == (
        "concurrency 3, 1 process, perfTest's other options")
    assert "batch 100," in peers.label("jobqueue", "--import m --batch-size 100")
    for setup in peers.comparison_setups(
            "noop", processes=[1, 2], pgqueuer_batch=1000, procrastinate_concurrency=30,
            procrastinate_n=10, course_n=10, perftest=True):
        args = peers.argv(setup)
        assert peers.settings(setup) == peers.label(setup["system"], args,
                                                    setup.get("workers", 1))


def test_the_comparison_gives_every_queue_the_same_process_counts() -> None:
    setups = peers.comparison_setups(
        "write_row", processes=[1, 2], pgqueuer_batch=1000, procrastinate_concurrency=30,
        procrastinate_n=10, course_n=10, perftest=True)
    counts = {}
    for s in setups:
        counts.setdefault(s["system"], set()).add(s.get("workers", 1))
    assert counts == {"jobqueue": {1, 2}, "pgqueuer": {1, 2}, "procrastinate": {1, 2},
                      "oban-py": {1, 2}, "graphile-worker": {1, 2, graphile.PERFTEST_PROCESSES}}
    two = [s for s in setups if s["system"] == "jobqueue" and s["workers"] == 2]
    assert two[0]["flags"] == ["--shared"]  # so that both processes take jobs
    assert "course design" not in counts  # no-op jobs only


def test_presets_single_out_the_cli_defaults_and_perftest() -> None:
    assert peers.preset({"system": "jobqueue", "flags": []}) == peers.CLI_DEFAULTS
    assert peers.preset({"system": "jobqueue"}) == peers.CLI_DEFAULTS
    assert peers.preset({"system": "jobqueue", "flags": ["--log-level", "WARNING"]}) == ""
    assert peers.preset({"system": "jobqueue", "flags": ["--shared"], "workers": 2}) == ""
    assert peers.preset({"system": "graphile-worker", "workers": 4}) == peers.PERFTEST
    assert peers.preset({"system": "graphile-worker", "workers": 4, "concurrency": 8}) == ""
    assert peers.preset({"system": "graphile-worker", "workers": 1}) == ""
    assert peers.preset({"system": "pgqueuer", "batch_size": 10}) == ""



async def test_jobqueue_at_its_cli_defaults_drains_and_stops_on_sigterm(
        server_url: str, tmp_path: Path) -> None:
    name = f"t{uuid.uuid4().hex[:8]}"
    async with scenarios.bench_database(name) as url:
        row = await scenarios.cli_drain(url, n=300, log_dir=tmp_path)
        conn = await db.connect(url)
        try:
            counts = dict(await conn.fetch("SELECT status, count(*) FROM jobs GROUP BY 1"))
        finally:
            await conn.close()
    assert counts == {"completed": 300}  # and the worker exited 0 on SIGTERM, or it raised
    assert row["argv"] == "--import jobqueue.benchmarks.handlers"  # no other flag: no --burst
    assert (row["concurrency"], row["batch_size"], row["log_level"]) == (
        DEFAULT_CONCURRENCY, DEFAULT_BATCH_SIZE, "INFO")
    assert row["settings"] == peers.settings({"system": "jobqueue", "flags": []})
    assert row["jobs_per_sec"] > 0 and row["rss_peak_mib"] > 10
    log = (tmp_path / "drain-0.log").read_text()
    assert " INFO " in log and "stop requested" in log  # its INFO text logs, to a file


async def test_a_cli_drain_fails_at_once_when_a_worker_exits(server_url: str) -> None:
    name = f"t{uuid.uuid4().hex[:8]}"
    async with scenarios.bench_database(name) as url:
        with pytest.raises(RuntimeError, match="exited with 1 before the drain ended"):
            await scenarios.cli_drain(url, n=10, flags=["--import", "no_such_module"],
                                      timeout=TIMEOUT)


async def test_jobqueue_real_work_writes_exactly_its_rows(server_url: str) -> None:
    name = f"t{uuid.uuid4().hex[:8]}"
    async with scenarios.bench_database(name) as url:
        rows = await scenarios.cli_drain(url, n=200, handler="write_row",
                                         flags=["--log-level", "WARNING"], workers=2)
        paid = await scenarios.cli_drain(url, n=300, handler="process_payment")
        conn = await db.connect(url)
        try:
            written = await conn.fetchrow(
                "SELECT count(*) AS n, sum(amount) AS total FROM demo_payments")
            # The checks see a payment that went to the wrong balance.
            await scenarios.check_writes(conn, "process_payment", 300, "jobqueue")
            await conn.execute("UPDATE demo_users SET balance = balance + 1 WHERE id = 1")
            with pytest.raises(RuntimeError, match="mismatched 1 != 0"):
                await scenarios.check_writes(conn, "process_payment", 300, "jobqueue")
        finally:
            await conn.close()
    assert rows["handler"] == "write_row" and rows["workers"] == 2
    assert paid["argv"] == "--import jobqueue.lab.examples"  # the seed's own handler
    assert written["n"] == 300
    assert written["total"] == sum(Decimal(p["amount"]) for p in scenarios.payments(300))


@pytest.mark.parametrize(("peer_url", "setting"),
                         [("pgqueuer", {"batch_size": 50, "workers": 2}),
                          ("procrastinate", {"concurrency": 4, "workers": 1}),
                          ("oban-py", {"limit": 4, "workers": 1})],
                         indirect=["peer_url"])
async def test_each_peer_pays_each_payment_exactly_once(
        peer_url: str, setting: dict[str, int], request: pytest.FixtureRequest) -> None:
    system = request.node.callspec.params["peer_url"]
    row = await peers.drain(system, peer_url, n=150, handler="process_payment", **setting)
    assert row["handler"] == "process_payment" and row["n"] == 150
    conn = await db.connect(peer_url)
    try:  # drain checked this too (scenarios.check_writes); seen here directly
        payments = await conn.fetchval("SELECT count(DISTINCT payment_id) FROM demo_payments")
        balances = await conn.fetchval("SELECT sum(balance) FROM demo_users")
    finally:
        await conn.close()
    assert payments == 150
    assert balances == sum(Decimal(p["amount"]) for p in scenarios.payments(150))


def test_payments_are_positive_unique_and_spread() -> None:
    made = scenarios.payments(25_000)
    assert len({p["payment_id"] for p in made}) == 25_000
    assert min(Decimal(p["amount"]) for p in made) > 0
    assert len({p["user_id"] for p in made}) == scenarios.PAYMENT_USERS
    # Jobs side by side (a batch of 1,000 in each of four lanes) pay different users.
    assert len({p["user_id"] for p in made[:4_000]}) == 4_000


async def test_the_report_has_a_peers_section_only_when_it_was_measured(
        server_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pgqueuer")
    pytest.importorskip("procrastinate")
    monkeypatch.setattr("jobqueue.benchmarks.results_dir", lambda: tmp_path)
    tag = uuid.uuid4().hex[:8]
    names = {"jobqueue": f"t{tag}", "pgqueuer": f"t{tag}_pgq", "procrastinate": f"t{tag}_pro"}
    urls = {"jobqueue": await scenarios.open_bench(names["jobqueue"])}
    try:
        for system in ("pgqueuer", "procrastinate"):
            urls[system] = await peers.open_peer(system, names[system])
        context = {**await scenarios.environment(urls["jobqueue"]), **peers.versions()}
        matrix = await scenarios.drain_matrix(urls["jobqueue"], n=100, batch_sizes=[50],
                                              workers=[1], modes=["exclusive"], repeat=1)
        save(matrix, "throughput_matrix", context)
        text = render(tmp_path, tmp_path / "BENCHMARKS.md").read_text()
        assert "## Throughput" in text and "Beside its peers" not in text  # no CSVs, no section

        setups = [{"system": "jobqueue", "flags": []}, {"system": "pgqueuer"},
                  {"system": "procrastinate", "concurrency": 2, "n": 50},
                  {"system": "course design"}]
        save(await peers.drain_comparison(urls, setups, n=100, repeat=1), "comparison_drain",
             context)
        summaries, samples = await peers.latency_comparison(
            urls, setups[:3], rates=[20], seconds=0.25, repeat=1)
        save(summaries, "comparison_latency", context)
        save(samples, "comparison_latency_samples", context)
        memory, timelines = await peers.memory_comparison(
            urls, [{**s, "n": 200} for s in setups[:3]])
        save(memory, "comparison_memory", context)
        save(timelines, "comparison_memory_timeline", context)
    finally:
        for name in names.values():
            await scenarios.close_bench(name)

    text = render(tmp_path, tmp_path / "BENCHMARKS.md").read_text()
    assert "| warm-up left out (s) | counted (s) |" in text  # said by the latency table
    assert "Configuration of each system, as run here and as its documentation advises" in text
    assert "change per 10,000 jobs (MiB)" in text  # the memory table
    for heading in ("## Beside its peers", "### Draining 100 no-op jobs",
                    "### Latency under open-loop", "### Memory over a long drain",
                    "PgQueuer 1.6.0", "| Procrastinate |"):
        assert heading in text
    # The headline table: jobqueue at its CLI defaults against each peer's best; a
    # peer that drained another n is flagged; the course design is not a peer.
    glance = text[text.index("## At a glance"):text.index("## Setup")]
    assert "| drain, noop (jobs/s) |" in glance and "PgQueuer: " in glance
    assert "Procrastinate drained 50 jobs, jobqueue 100" in glance
    assert "course design" not in glance
    assert "enqueue → completion p50 at 20 jobs/s (ms)" in glance
    assert "| course design | a transaction per job, ORM, in-process |" in text
    for figure in ("comparison_drain", "comparison_latency", "comparison_latency_cdf",
                   "comparison_memory"):
        assert (tmp_path / f"{figure}.png").stat().st_size > 0
    assert text.index("## Beside its peers") < text.index("Celery + Redis")

    (tmp_path / "throughput_matrix.csv").unlink()  # the peers alone still render
    text = render(tmp_path, tmp_path / "BENCHMARKS.md").read_text()
    assert "## Beside its peers" in text and "## Throughput" not in text


async def test_every_row_is_labelled_from_the_arguments_its_processes_got(
        server_url: str) -> None:
    """The class of bug where a run used one knob and its label said another
    (jobqueue's latency and memory runs at batch 100 labelled "batch 1000"):
    every comparison, run with knobs that are nobody's default, records the
    arguments its processes got, and its label is read back from them."""
    pytest.importorskip("pgqueuer")
    pytest.importorskip("procrastinate")
    tag = uuid.uuid4().hex[:8]
    names = {"jobqueue": f"t{tag}", "pgqueuer": f"t{tag}_pgq", "procrastinate": f"t{tag}_pro"}
    setups = [{"system": "jobqueue", "flags": ["--batch-size", "50", "--concurrency", "1"]},
              {"system": "pgqueuer", "batch_size": 7, "workers": 2},
              {"system": "procrastinate", "concurrency": 3, "n": 30, "workers": 2}]
    knobs = {"jobqueue": ("--batch-size 50", "batch 50"), "pgqueuer": ("--batch-size 7", "batch 7"),
             "procrastinate": ("--concurrency 3", "concurrency 3")}
    if peers.available("oban-py"):
        names["oban-py"] = f"t{tag}_oban"
        setups.append({"system": "oban-py", "limit": 3, "n": 30, "workers": 2})
        knobs["oban-py"] = ("--queues default:3", "limit 3")
    urls = {"jobqueue": await scenarios.open_bench(names["jobqueue"])}
    try:
        for system in names.keys() - {"jobqueue"}:
            urls[system] = await peers.open_peer(system, names[system])
        drains = await peers.drain_comparison(urls, setups, n=60, repeat=1)
        latency, _ = await peers.latency_comparison(urls, setups, rates=[40], seconds=0.25,
                                                    repeat=1, warmup=0.1)
        memory, timeline = await peers.memory_comparison(
            urls, [{**s, "n": 100, "workers": 1} for s in setups])
    finally:
        for name in names.values():
            await scenarios.close_bench(name)
    for rows in (drains, latency, memory):
        assert {r["system"] for r in rows} == set(knobs)  # something to check, every system
        for row in rows:
            flag, said = knobs[row["system"]]
            assert flag in row["argv"]  # the knob reached the processes' command line
            workers = row.get("workers", 1) if rows is drains else 1
            assert row["settings"] == peers.label(row["system"], row["argv"], workers)
            assert said in row["settings"]
    assert [r["batch_size"] for r in drains if r["system"] == "jobqueue"] == [50]
    assert {p["settings"] for p in timeline} == {r["settings"] for r in memory}
