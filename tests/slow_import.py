"""A handler module that takes its time to import (`--import tests.slow_import`):
it says it is importing, by a file, and waits for the test's go-ahead, by
another, so a test can signal a worker that is still starting."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from jobqueue import handlers

_folder = Path(os.environ["JOBQUEUE_TEST_IMPORT_GATE"])
(_folder / "importing").touch()
_deadline = time.monotonic() + 60
while not (_folder / "go").exists() and time.monotonic() < _deadline:
    time.sleep(0.01)


@handlers.register("slow_import_noop")
async def slow_import_noop(session: Any, payload: dict[str, Any]) -> None:
    """A handler, so that the worker has something to run (one without any
    does not start)."""
