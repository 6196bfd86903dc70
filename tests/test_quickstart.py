"""The README's quickstart and FastAPI example, run as a user runs them.

The files and the commands come out of the README's titled code blocks, so
the page cannot drift from what works: `shop.py` and `app.py` are written
into an empty folder, and each command line runs there in a shell, on an
empty database of this test's own. Three liberties, each a line the README
itself leaves to the reader: the line that chooses `DATABASE_URL` (the test's
database stands in for it), the port (a free one for 8000, which another
program may hold), and `curl` (its method, URL and expected answer are read
from the line and sent with httpx, so the test needs no curl binary).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from jobqueue import db
from jobqueue.testing import wait_for
from tests.conftest import wait_answering

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCK = re.compile(r'^```\w+ title="(?P<title>[^"]+)"\n(?P<body>.*?)^```\n', re.M | re.S)
COMMENT = re.compile(r"\s+#\s?(?P<text>.*)$")


def readme_blocks() -> dict[str, str]:
    return {m["title"]: m["body"] for m in BLOCK.finditer(README.read_text())}


def lines_of(block: str) -> list[tuple[str, str]]:
    """Each command of a shell block and the comment after it."""
    out = []
    for line in block.splitlines():
        comment = COMMENT.search(line)
        command = line[:comment.start()] if comment else line
        if command.strip():
            out.append((command.strip(), comment["text"] if comment else ""))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def empty_url(server_url: str) -> AsyncIterator[str]:
    """A database with nothing in it: the quickstart runs `jobqueue migrate` itself."""
    name = f"quickstart_{uuid.uuid4().hex[:12]}"
    yield await db.create_database(server_url, name)
    await db.drop_database(server_url, name)


def test_the_readme_has_the_blocks_this_test_runs() -> None:
    blocks = readme_blocks()
    assert {"shop.py", "app.py", "quickstart", "status", "fastapi"} <= blocks.keys()
    first = lines_of(blocks["quickstart"])[0][0]
    assert first == "export DATABASE_URL=$(jobqueue db up)"


class UserFolder:
    """An empty folder with the README's files, where commands run as a user's
    shell runs them, with `DATABASE_URL` set."""

    def __init__(self, path: Path, url: str, files: dict[str, str]) -> None:
        self.path = path
        for name, text in files.items():
            (path / name).write_text(text)
        self.env = {**os.environ, "DATABASE_URL": url, "PYTHONUNBUFFERED": "1",
                    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        self.env.pop("PYTHONPATH", None)  # the user's folder, not the checkout's tests
        self.background: list[subprocess.Popen[str]] = []
        self._log = open(path / "background.log", "w")  # noqa: SIM115 - closed in close()

    def run(self, command: str) -> str:
        done = subprocess.run(command, shell=True, cwd=self.path, env=self.env, text=True,
                              capture_output=True, timeout=120)
        assert done.returncode == 0, f"{command}: {done.stderr[-2000:]}"
        return done.stdout

    def start(self, command: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(shlex.split(command.removesuffix("&")), cwd=self.path,
                                env=self.env, text=True, stdout=self._log,
                                stderr=subprocess.STDOUT)
        self.background.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.background:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
        self._log.close()


async def run_quickstart(folder: UserFolder, blocks: dict[str, str],
                         conn: asyncpg.Connection) -> None:
    """The quickstart, line by line; the worker in the background until the
    order is paid, then `jobqueue status` from the second terminal."""
    quickstart = lines_of(blocks["quickstart"])
    assert quickstart[0][0].startswith("export DATABASE_URL=")
    outputs = {}
    worker = None
    for command, _ in quickstart[1:]:
        if command.startswith("jobqueue worker"):
            worker = folder.start(command)
        else:
            outputs[command] = folder.run(command)
    assert "order 1 placed" in outputs["python shop.py"]
    assert worker is not None

    async def paid() -> bool:
        return bool(await conn.fetchval("SELECT paid FROM orders WHERE id = 1"))
    await wait_for(paid, timeout=30, message="the worker charging order 1")
    job = await conn.fetchrow("SELECT status, result FROM jobs")
    assert job["status"] == "completed" and json.loads(job["result"]) == {"charged": 1999}

    [(status, expected)] = lines_of(blocks["status"])
    count, state = expected.split()  # "1 completed"
    assert re.search(rf"^\s+{state}\s+{count}$", folder.run(status), re.M)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0


async def send(http: httpx.AsyncClient, command: str, comment: str) -> Any:
    """A README `curl localhost:8000/...` line, sent with httpx; the answer
    the line's comment shows, when it shows one, is the answer expected."""
    argv = shlex.split(command)
    assert argv[0] == "curl"
    method = argv[argv.index("-X") + 1] if "-X" in argv else "GET"
    url = next(a for a in argv[1:] if a.startswith("localhost:8000"))
    response = await http.request(method, url.removeprefix("localhost:8000"))
    assert response.is_success, (command, response.text)
    if comment.startswith("{"):
        assert response.json() == json.loads(comment)
    return response.json()


async def run_fastapi(folder: UserFolder, blocks: dict[str, str]) -> None:
    """uvicorn in the background, then the requests."""
    port = free_port()
    requests = []
    for command, comment in lines_of(blocks["fastapi"]):
        command = command.replace("--port 8000", f"--port {port}")
        if command.startswith("uvicorn"):
            folder.start(command)
        else:
            requests.append((command, comment))
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
        await wait_answering(http, "/queue/queues")
        answers = [await send(http, command, comment) for command, comment in requests]
        assert answers[0] == {"order_id": 2}
        listed = answers[1]["jobs"]
        assert [j["job_type"] for j in listed] == ["charge_order", "charge_order"]
        assert [j["status"] for j in listed] == ["pending", "completed"]  # newest first
        assert (await http.get("/queue/")).status_code == 200  # the dashboard


async def test_the_quickstart_and_the_fastapi_example_run_as_written(
    empty_url: str, tmp_path: Path
) -> None:
    blocks = readme_blocks()
    folder = UserFolder(tmp_path, empty_url, {name: blocks[name] for name in ("shop.py", "app.py")})
    conn = await asyncpg.connect(**db.asyncpg_connect_args(empty_url))
    try:
        await run_quickstart(folder, blocks, conn)
        await run_fastapi(folder, blocks)
        assert await conn.fetchval("SELECT count(*) FROM orders") == 2
    finally:
        folder.close()
        await conn.close()
