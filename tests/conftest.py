"""Fixtures: one PostgreSQL 16 for the run, one fresh database per test.

The schema is built once, by the real migrations, into a template database;
each test gets `CREATE DATABASE … TEMPLATE` (a file copy, tens of
milliseconds), so tests are isolated completely and can run workers against
their own database.

`make test` runs them in parallel processes (pytest-xdist, `-n 2 --dist
loadfile`), all on the one server: the controlling process starts it before
the workers exist and stops it at the end if it started it; each worker
process has a template of its own. A test that looks at pg_stat_activity or
pg_locks looks at its own database only. A test marked `serial` (it restarts
the server, or what it checks follows the machine's pace) runs with no other
test running beside it: see `pytest_runtest_protocol`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from jobqueue import HandlerRegistry, db, embedded
from jobqueue.api import TOKEN_ENV, create_app
from jobqueue.schema import migrations
from jobqueue.testing import WorkerProcess, wait_for

ROOT = Path(__file__).resolve().parents[1]
# One template per test run, so that two runs on one server never drop each other's.
TEMPLATE = f"jobqueue_test_template_{os.getpid()}"

# Tables the test handlers write to. `events` is written outside the job's
# transaction (it shows what ran, even if rolled back); `effects` is written
# through the handler's session, so it commits exactly when the job does.
TEST_TABLES = (
    """CREATE TABLE events (
           job_id uuid NOT NULL, kind text NOT NULL, worker_pid integer,
           at timestamptz NOT NULL DEFAULT clock_timestamp())""",
    """CREATE TABLE effects (
           job_id uuid NOT NULL, n integer NOT NULL DEFAULT 1,
           at timestamptz NOT NULL DEFAULT clock_timestamp())""",
)


def _xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _xdist_controller(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "numprocesses", None)) and not _xdist_worker(config)


def pytest_sessionstart(session: pytest.Session) -> None:
    """With `-n`, the controlling process starts the embedded server before
    any worker process exists: otherwise two workers could each find it down,
    and the first to finish would stop it under the other."""
    config = session.config
    if not _xdist_controller(config):
        return
    config.stash[_LOCKS] = Path(tempfile.mkdtemp(prefix="jobqueue-tests-"))
    if not os.environ.get("DATABASE_URL"):
        server = embedded.EmbeddedPostgres()
        config.stash[_STARTED_HERE] = not server.is_running()
        server.start()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Tell each worker process where the files of the serial lock are."""
    node.workerinput["jobqueue_locks"] = str(node.config.stash[_LOCKS])


def pytest_sessionfinish(session: pytest.Session) -> None:
    stash = session.config.stash
    if stash.get(_STARTED_HERE, False):
        embedded.EmbeddedPostgres().stop()
    if _LOCKS in stash:
        shutil.rmtree(stash[_LOCKS], ignore_errors=True)


_STARTED_HERE = pytest.StashKey[bool]()
_LOCKS = pytest.StashKey[Path]()


@pytest.fixture(scope="session")
def server_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """The server's URL: DATABASE_URL if set, else the embedded PostgreSQL 16
    (stopped again at the end if this run started it; in a worker process of
    `-n`, the controlling process does that)."""
    if os.environ.get("DATABASE_URL"):
        yield db.normalize_url(os.environ["DATABASE_URL"])
        return
    server = embedded.EmbeddedPostgres()
    was_running = server.is_running() or _xdist_worker(request.config)
    url = server.start()  # idempotent, and safe from several processes at once
    yield url
    if not was_running:
        server.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    """Under `-n`, a test marked `serial` runs alone: a readers-writer lock
    over the worker processes, of two files. Every test holds `room` shared
    for its setup, call and teardown (so also while it builds or drops the
    fixtures its module or the session share); a serial test holds it
    exclusive, so it starts once the tests running beside it have ended.
    `gate` keeps new tests from slipping in meanwhile: a test passes it on
    its way in, and a serial test holds it from its wait to its end."""
    if not _xdist_worker(item.config):
        return (yield)
    folder = Path(item.config.workerinput["jobqueue_locks"])  # type: ignore[attr-defined]
    serial = item.get_closest_marker("serial") is not None
    with contextlib.ExitStack() as held:
        gate, room = (held.enter_context(open(folder / name, "a")) for name in ("gate", "room"))
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(room, fcntl.LOCK_EX if serial else fcntl.LOCK_SH)
        if not serial:
            fcntl.flock(gate, fcntl.LOCK_UN)
        return (yield)  # closing the files lets go of the locks


@pytest.fixture(scope="session")
async def template_url(server_url: str) -> AsyncIterator[str]:
    url = await db.create_database(server_url, TEMPLATE, replace=True)
    await migrations.upgrade(url)
    engine = create_async_engine(url)
    async with engine.begin() as conn:
        for statement in TEST_TABLES:
            await conn.exec_driver_sql(statement)
    await engine.dispose()
    yield url
    await db.drop_database(server_url, TEMPLATE)


@pytest.fixture
async def db_url(server_url: str, template_url: str) -> AsyncIterator[str]:
    """A database of this test's own, with the schema in place."""
    name = f"test_{uuid.uuid4().hex[:12]}"
    yield await db.create_database(server_url, name, template=TEMPLATE)
    await db.drop_database(server_url, name)


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    eng = create_async_engine(db_url)
    yield eng
    await eng.dispose()


@pytest.fixture
async def conn(db_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A plain asyncpg connection for looking at the tables."""
    c = await asyncpg.connect(**db.asyncpg_connect_args(db_url))
    yield c
    if not c.is_closed():  # a test may have restarted the server under it
        try:
            await c.close(timeout=5)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            c.terminate()


def run_cli(*args: str, url: str | None) -> subprocess.CompletedProcess[str]:
    """`python -m jobqueue ARGS` as a user runs it, on `url` (None: with
    DATABASE_URL unset)."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    if url:
        env["DATABASE_URL"] = url
    return subprocess.run([sys.executable, "-m", "jobqueue", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def spawn_worker(db_url: str, tmp_path: Path) -> Iterator[object]:
    started: list[WorkerProcess] = []

    def spawn(*args: str, handlers: str = "tests.handlers") -> WorkerProcess:
        """A `jobqueue worker ARGS` importing the module `handlers`."""
        w = WorkerProcess(db_url, tmp_path / f"worker-{len(started)}.log",
                          "--import", handlers, *args, cwd=ROOT)
        started.append(w)
        return w

    yield spawn
    for w in started:
        w.close()


async def wait_answering(client: httpx.AsyncClient, path: str,
                         alive: Callable[[], object] = lambda: None) -> None:
    """Wait until a server just started answers `path` (any status);
    `alive` raises if the server's process died meanwhile."""
    async def answers() -> bool:
        alive()
        try:
            await client.get(path)
        except httpx.TransportError:
            return False
        return True
    await wait_for(answers, timeout=30, message=f"a server answering {path}")


def client_for(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost")


@pytest.fixture
async def make_client(db_url: str, monkeypatch: pytest.MonkeyPatch
                      ) -> AsyncIterator[Callable[..., httpx.AsyncClient]]:
    """Build an app (after the test set the environment) and a client for it."""
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    apps: list[FastAPI] = []

    def make(**options: Any) -> httpx.AsyncClient:
        app = create_app(db_url, **options)
        apps.append(app)
        return client_for(app)

    yield make
    for app in apps:
        await app.state.jobqueue_engine.dispose()


@pytest.fixture
async def client(db_url: str, monkeypatch: pytest.MonkeyPatch
                 ) -> AsyncIterator[httpx.AsyncClient]:
    """The HTTP API of `jobqueue serve` on this test's database, in process."""
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    app = create_app(db_url)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://localhost") as c:
        yield c
    await app.state.jobqueue_engine.dispose()


@pytest.fixture
async def child_registry(conn) -> HandlerRegistry:
    """`child` jobs insert into a table whose foreign key is checked only at COMMIT."""
    await conn.execute(
        "CREATE TABLE parents (id int PRIMARY KEY);"
        "CREATE TABLE children (parent int REFERENCES parents DEFERRABLE INITIALLY DEFERRED);"
        "INSERT INTO parents VALUES (1)")
    registry = HandlerRegistry()

    @registry.register("child")
    async def child(session: Any, payload: dict[str, Any]) -> None:
        await session.execute(text("INSERT INTO children VALUES (:p)"), {"p": payload["p"]})

    return registry
