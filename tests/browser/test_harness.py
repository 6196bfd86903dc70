"""Without a browser, the browser tests are skipped and the run says so on one
line (here with the project's `-ra`, as `make test` runs; without `-r` the
line comes from the conftest's terminal summary instead)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.browser.conftest import CHROMIUM_ENV
from tests.conftest import ROOT


def test_without_a_browser_one_line_says_the_tests_were_skipped() -> None:
    env = {**os.environ, CHROMIUM_ENV: "/nonexistent/chromium"}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/browser/test_smoke.py",
         "-p", "no:cacheprovider", "-p", "no:nbval"],  # nbval's imports alone take seconds
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 skipped" in run.stdout and "passed" not in run.stdout, run.stdout
    lines = [line for line in run.stdout.splitlines() if "browser tests skipped" in line]
    assert len(lines) == 1, run.stdout
    assert f"{CHROMIUM_ENV}=/nonexistent/chromium is not an executable" in lines[0]
    assert "apt-get install chromium" in lines[0]
