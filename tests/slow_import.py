"""A handler module that takes its time to import (`--import tests.slow_import`):
it says it is importing, by a file, and waits for the test's go-ahead, by
another, so a test can signal a worker that is still starting."""

from __future__ import annotations

import os
import time
from pathlib import Path

_folder = Path(os.environ["JOBQUEUE_TEST_IMPORT_GATE"])
(_folder / "importing").touch()
_deadline = time.monotonic() + 60
while not (_folder / "go").exists() and time.monotonic() < _deadline:
    time.sleep(0.01)
