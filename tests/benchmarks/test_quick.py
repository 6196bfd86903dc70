"""`python -m jobqueue.benchmarks.quick`, small: it must run, lose nothing and
report sane figures, in a benchmark database of its own."""

from __future__ import annotations

import csv
import uuid
from pathlib import Path

import pytest

from jobqueue.benchmarks import quick


def _ordered(result: dict, prefix: str) -> None:
    p50, p95, p99 = (result[f"{prefix}p{q}_ms"] for q in (50, 95, 99))
    assert 0 < p50 <= p95 <= p99


async def test_drain_and_lone_job_latency(server_url: str, tmp_path: Path) -> None:
    args = quick.parse_args(["--sizes", "50", "--repeat", "2", "--batch-size", "20",
                             "--samples", "5"])
    results = await quick.run_all(args, f"t{uuid.uuid4().hex[:8]}")
    runs, lone = results["runs"], results["lone"]
    assert [(r["n"], r["run"], r["batch_size"]) for r in runs] == [(50, 1, 20), (50, 2, 20)]
    for run in runs:
        assert run["seconds"] > 0 and run["jobs_per_sec"] > 0
        _ordered(run, "")
    assert 3 <= lone["samples"] <= 7  # the jobs after the warm-up second
    _ordered(lone, "start_")
    _ordered(lone, "complete_")
    assert "| 50 |" in quick.drain_table(runs)
    quick.write_csv(tmp_path / "core.csv", results["context"], runs, lone)
    rows = list(csv.DictReader(line for line in (tmp_path / "core.csv").open()
                               if not line.startswith("#")))
    assert [r["kind"] for r in rows] == ["drain", "drain", "lone_start", "lone_complete"]


async def test_refuses_other_databases() -> None:
    """It truncates `jobs`: never on a database that is not the benchmark's."""
    for name in ("jobqueue", "jobqueue_benchmark_of_prod", None):
        with pytest.raises(ValueError, match="jobqueue_bench"):
            quick.check_bench_name(name)
    assert quick.check_bench_name("jobqueue_bench_x") == "jobqueue_bench_x"


def test_quantiles_match_percentile_cont() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert [quick.quantile(values, q) for q in (0.5, 0.95, 0.99)] == pytest.approx(
        [3.0, 4.8, 4.96])
