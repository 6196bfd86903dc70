"""The embedded PostgreSQL 16: settings, idempotence, crash recovery, root safety."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from jobqueue.embedded import (
    DATABASE_NAME,
    POSTGRES_MAJOR,
    RUNTIME_ROOT,
    SERVER_SETTINGS,
    SUPERUSER,
    EmbeddedPostgres,
    default_home,
)
from jobqueue.embedded.paths import user_home

REPO = Path(__file__).resolve().parents[1]


def _wait_until(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll instead of sleeping a fixed time."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(0.02)


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedPostgres]:
    """A server in a fresh, world-traversable folder under /tmp (so as root, too, the data
    stays in home/pgdata). Stopped and deleted at the end."""
    folder = Path(tempfile.mkdtemp(prefix="jq-embedded-"))
    folder.chmod(0o755)  # our own folder; mkdtemp makes it 0700
    pg = EmbeddedPostgres(folder / ".jobqueue")
    pg.start()
    try:
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(folder, ignore_errors=True)
        if pg.socket_dir.parent == Path("/tmp"):
            shutil.rmtree(pg.socket_dir, ignore_errors=True)


def test_compose_matches_embedded_defaults() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    service = compose["services"]["postgres"]
    image, _, tag = service["image"].partition(":")
    assert image == "postgres"
    assert int(tag.split(".")[0].split("-")[0]) == POSTGRES_MAJOR
    env = service["environment"]
    assert env["POSTGRES_DB"] == DATABASE_NAME
    assert env["POSTGRES_USER"] == SUPERUSER
    command = service["command"]
    assert command[0] == "postgres"
    args = command[1:]
    assert args[0::2] == ["-c"] * (len(args) // 2) and len(args) % 2 == 0
    settings = dict(arg.split("=", 1) for arg in args[1::2])
    assert settings == SERVER_SETTINGS
    assert list(settings) == list(SERVER_SETTINGS)  # same order, easy to compare by eye
    assert service["healthcheck"]["test"]


def test_url_and_paths_are_a_pure_function_of_home(tmp_path: Path) -> None:
    home = tmp_path / ".jobqueue"
    a, b = EmbeddedPostgres(home), EmbeddedPostgres(home)
    assert a.url() == b.url() == f"postgresql+asyncpg://postgres@/jobqueue?host={a.socket_dir}"
    assert a.url("postgres", driver="") == f"postgresql://postgres@/postgres?host={a.socket_dir}"
    assert not home.exists()  # computing paths creates nothing


def test_long_home_gets_a_short_deterministic_socket_dir(tmp_path: Path) -> None:
    home = tmp_path / ("x" * 120) / ".jobqueue"
    pg = EmbeddedPostgres(home)
    assert len(f"{pg.socket_dir}/.s.PGSQL.5432".encode()) <= 107
    assert pg.socket_dir == EmbeddedPostgres(home).socket_dir
    assert pg.socket_dir != EmbeddedPostgres(tmp_path / ".jobqueue").socket_dir


def test_default_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("JOBQUEUE_HOME", str(tmp_path / "h"))
    assert default_home() == tmp_path / "h"
    monkeypatch.delenv("JOBQUEUE_HOME")
    assert default_home() == REPO / ".jobqueue"  # we run from a source checkout


def test_an_installed_package_keeps_one_server_per_user_wherever_it_runs(
    tmp_path: Path
) -> None:
    """The package copied out of the checkout (as a wheel installs it), run
    from two folders: the same per-user home each time, never the folder it
    ran from (`./.jobqueue` made a new cluster in each)."""
    site = tmp_path / "site"
    shutil.copytree(REPO / "jobqueue", site / "jobqueue",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items()
           if k not in ("JOBQUEUE_HOME", "XDG_DATA_HOME")}
    env.update(PYTHONPATH=str(site), HOME=str(tmp_path / "user"))
    show = "import jobqueue.embedded.paths as p; print(p.__file__); print(p.default_home())"
    homes = set()
    for where in (tmp_path / "a", tmp_path / "b"):
        where.mkdir()
        out = subprocess.run([sys.executable, "-c", show], cwd=where, env=env,
                             capture_output=True, text=True, check=True).stdout.split("\n")
        assert out[0].startswith(str(site))  # the copy ran, not the checkout
        homes.add(out[1])
    assert homes == {str(tmp_path / "user" / ".local" / "share" / "jobqueue")}
    env["XDG_DATA_HOME"] = str(tmp_path / "data")
    out = subprocess.run([sys.executable, "-c", show], cwd=tmp_path, env=env,
                         capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[1] == str(tmp_path / "data" / "jobqueue")


def test_user_home_follows_xdg_and_ignores_a_relative_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    assert user_home() == tmp_path / ".local" / "share" / "jobqueue"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/data")  # invalid, says the spec
    assert user_home() == tmp_path / ".local" / "share" / "jobqueue"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "d"))
    assert user_home() == tmp_path / "d" / "jobqueue"


@pytest.mark.parametrize("args", [["db", "url"], ["status"]])
def test_every_command_on_the_embedded_server_says_which(server: EmbeddedPostgres,
                                                         args: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["JOBQUEUE_HOME"] = str(server.home)
    result = subprocess.run([sys.executable, "-m", "jobqueue", *args], env=env, cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert f"the embedded PostgreSQL 16 in {server.home}" in result.stderr


def test_embedded_server_is_postgres_16_with_our_settings(server: EmbeddedPostgres) -> None:
    assert server.is_running()
    assert server.data_dir == server.home / "pgdata"
    assert server.psql("SHOW server_version_num").startswith(str(POSTGRES_MAJOR))
    assert server.psql("SHOW max_connections") == SERVER_SETTINGS["max_connections"]
    assert server.psql("SHOW timezone") == SERVER_SETTINGS["timezone"]
    assert server.psql("SHOW fsync") == "on"
    assert server.psql("SHOW synchronous_commit") == "on"
    assert server.psql("SHOW listen_addresses") == ""  # unix socket only
    assert server.psql("SELECT current_database()") == DATABASE_NAME
    assert stat.S_IMODE(server.socket_dir.stat().st_mode) == 0o700  # trust auth: the gate


def test_start_is_idempotent_and_stop_restart_work(server: EmbeddedPostgres) -> None:
    pid = server.postmaster_pid()
    assert pid is not None
    assert server.start() == server.url()
    assert server.postmaster_pid() == pid
    assert EmbeddedPostgres(server.home).start() == server.url()  # another instance
    assert server.postmaster_pid() == pid

    url = server.url()
    assert server.restart() == url
    assert server.postmaster_pid() not in (None, pid)

    server.stop()
    assert not server.is_running()
    server.stop()  # idempotent
    assert server.start() == url  # warm start leaves the fixture running
    assert server.psql("SELECT 1") == "1"


def test_start_recovers_after_postmaster_sigkill(server: EmbeddedPostgres) -> None:
    pid = server.postmaster_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    _wait_until(lambda: not server.is_running())  # a zombie counts as not running
    assert server.start() == server.url()
    assert server.postmaster_pid() not in (None, pid)
    assert server.psql("SELECT count(*) FROM pg_database WHERE datname = 'jobqueue'") == "1"


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs the server as another user")
def test_root_never_opens_parent_folders() -> None:
    private = Path(tempfile.mkdtemp(prefix="jq-private-"))  # 0700, like /root
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    pg = EmbeddedPostgres(private / "checkout" / ".jobqueue")
    try:
        pg.start()
        assert stat.S_IMODE(private.stat().st_mode) == 0o700
        assert pg.psql("SHOW server_version").startswith(f"{POSTGRES_MAJOR}.")
        assert not pg.data_dir.is_relative_to(private)
        assert pg.data_dir.is_relative_to(RUNTIME_ROOT)
        assert not pg.socket_dir.is_relative_to(private)
    finally:
        pg.stop()
        assert not pg.is_running()
        assert stat.S_IMODE(private.stat().st_mode) == 0o700
        if pg.data_dir.parent.parent == RUNTIME_ROOT.resolve():
            shutil.rmtree(pg.data_dir.parent, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)
