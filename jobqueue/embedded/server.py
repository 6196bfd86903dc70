"""`EmbeddedPostgres`: one PostgreSQL 16 cluster, started, stopped and
recovered with the bundled `initdb`, `pg_ctl` and `psql`."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from jobqueue.embedded.paths import (
    MAX_SOCKET_PATH,
    POSTGRES_MAJOR,
    RUNTIME_ROOT,
    SAFE_PATH,
    bundled_install,
    default_home,
    install_id,
    install_parts,
    install_reachable,
    make_world_readable,
    mkdirs,
    reachable_by_others,
)
from jobqueue.embedded.process import (
    SHM_IN_USE,
    EmbeddedPostgresError,
    is_postmaster_of,
    read_pid,
    shared_memory_in_use,
)
from jobqueue.embedded.server_user import (
    SERVER_OS_USER,
    ensure_server_user,
    hand_over,
    run_as_server_user,
)

logger = logging.getLogger("jobqueue.embedded")

#: Settings the server starts with (``-c key=value``), identical in docker-compose.yml.
#: Durability settings (fsync, synchronous_commit, full_page_writes) keep PostgreSQL's
#: defaults on purpose: benchmarks must measure a queue that does not lose jobs.
#: autovacuum_naptime: the launcher looks at each database every 10 s instead of
#: every minute; a queue at 1,000 jobs/s leaves 1,000 dead row versions a second,
#: and a table's own autovacuum settings cannot make vacuum come sooner than that.
SERVER_SETTINGS: dict[str, str] = {"max_connections": "200", "timezone": "UTC",
                                   "autovacuum_naptime": "10s"}

DATABASE_NAME = "jobqueue"
SUPERUSER = "postgres"
PORT = 5432

_START_TIMEOUT = 60
# psql errors that mean "not ready yet" rather than "broken".
_NOT_READY = ("starting up", "not yet accepting connections", "in recovery mode")
_LOG_ROTATE_BYTES = 50 * 1024 * 1024

_warned_relocations: set[Path] = set()


class EmbeddedPostgres:
    """One PostgreSQL 16 cluster under ``home``, started and stopped with ``pg_ctl``.

    Every method is safe to call from several processes at once: start/stop/restart
    hold an exclusive ``flock`` on ``home/.embedded.lock`` for their whole sequence.
    Paths and URL are a pure function of ``home`` (and ``port``), so every process
    computes the same.

    The defaults are jobqueue's own server: a unix socket only, on port 5432. A pair
    of servers for failover (``pair.py``) gives each its own ``port``, extra
    ``settings`` (``listen_addresses`` for TCP, replication) and a superuser
    ``password``, which initdb requires (scram-sha-256) on TCP; the socket stays
    ``trust``.
    """

    def __init__(self, home: Path | None = None, *, port: int = PORT,
                 settings: Mapping[str, str] | None = None,
                 password: str | None = None) -> None:
        self.home: Path = Path(home if home is not None else default_home()).expanduser().resolve()
        self.port = port
        self.settings = dict(settings or {})
        self._password = password
        self._as_root = os.geteuid() == 0
        self._relocated = self._as_root and not reachable_by_others(self.home)
        if self._relocated:
            name = self.home.parent.name if self.home.name == ".jobqueue" else self.home.name
            name = re.sub(r"[^A-Za-z0-9_.-]", "_", name.lstrip("."))[:40] or "home"
            digest = hashlib.sha1(str(self.home).encode()).hexdigest()[:10]
            base = RUNTIME_ROOT.resolve() / f"{name}-{digest}"
        else:
            base = self.home
        self._base = base
        self.data_dir: Path = base / "pgdata"
        self.log_file: Path = base / "postgres.log"
        self.socket_dir: Path = self._choose_socket_dir(base / "run")
        self._lock_file = self.home / ".embedded.lock"

    @property
    def place(self) -> str:
        """Where this server lives, as a command tells its user: the home, and
        the folder its data moved to when the server user cannot reach it."""
        return str(self.home) if self._base == self.home else f"{self.home} (data in {self._base})"

    def __repr__(self) -> str:
        return f"EmbeddedPostgres(home={str(self.home)!r}, data_dir={str(self.data_dir)!r})"

    def _choose_socket_dir(self, preferred: Path) -> Path:
        """``preferred`` unless its socket path is too long or has awkward characters.

        The fallback lives in /tmp (literal, not $TMPDIR, which may differ between
        processes) and is named after a hash of ``home``: deterministic for everyone.
        """
        socket = f"{preferred}/.s.PGSQL.{self.port}"
        if len(socket.encode()) <= MAX_SOCKET_PATH and SAFE_PATH.fullmatch(str(preferred)):
            return preferred
        digest = hashlib.sha1(f"{self.home}:{os.geteuid()}".encode()).hexdigest()[:12]
        return Path("/tmp") / f"jobqueue-{digest}"

    @functools.cached_property
    def bin_dir(self) -> Path:
        """Folder with initdb, pg_ctl, postgres, psql... (copied out of the venv if needed)."""
        install = bundled_install()
        if self._as_root and not install_reachable(install):
            root, _ = install_parts(install)
            copy = RUNTIME_ROOT.resolve() / f"pginstall-{POSTGRES_MAJOR}-{install_id(install)}"
            return copy / install.relative_to(root) / "bin"
        return install / "bin"

    # -- URLs --------------------------------------------------------------------------

    def url(self, database: str = DATABASE_NAME, driver: str = "asyncpg") -> str:
        """SQLAlchemy URL over the unix socket; ``driver=""`` gives a libpq-style URL."""
        scheme = f"postgresql+{driver}" if driver else "postgresql"
        port = "" if self.port == PORT else f"&port={self.port}"
        return f"{scheme}://{SUPERUSER}@/{database}?host={self.socket_dir}{port}"

    # -- running programs -------------------------------------------------------------

    def pg_ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``pg_ctl -D <data_dir> *args`` as the server user; the caller checks returncode."""
        self._ensure_binaries()
        return run_as_server_user(
            [self.bin_dir / "pg_ctl", "-D", self.data_dir, *args], timeout=_START_TIMEOUT + 30
        )

    def psql(self, sql: str, database: str = DATABASE_NAME) -> str:
        """Run one SQL command through the bundled psql; return its unaligned output.

        Handy for setup and tests without an event loop; raises on any SQL error.
        """
        self._ensure_binaries()
        result = run_as_server_user(
            [
                self.bin_dir / "psql",
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                self.socket_dir,
                "-p",
                str(self.port),
                "-U",
                SUPERUSER,
                "-d",
                database,
                "-c",
                sql,
            ],
            timeout=120,
        )
        if result.returncode != 0:
            raise EmbeddedPostgresError(f"psql failed ({sql!r}): {result.stderr.strip()}")
        return result.stdout.strip()

    # -- state -------------------------------------------------------------------------

    def postmaster_pid(self) -> int | None:
        """Pid of the live postmaster serving our data directory, else None."""
        pid = read_pid(self.data_dir / "postmaster.pid")
        if pid is not None and is_postmaster_of(pid, self.data_dir):
            return pid
        return None

    def is_running(self) -> bool:
        """True if a postmaster is serving ``data_dir`` (it may still be recovering)."""
        return self.postmaster_pid() is not None

    def is_initialized(self) -> bool:
        return (self.data_dir / "PG_VERSION").exists()

    # -- lifecycle ---------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Exclusive flock on ``home/.embedded.lock`` (released when the fd closes)."""
        mkdirs(self.home, 0o755 if self._as_root else None)
        fd = os.open(self._lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                logger.info("waiting for another process to finish starting/stopping %s", self.home)
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def start(self) -> str:
        """Start the server if it is not running (initdb first if needed); return ``url()``.

        Idempotent and safe to call concurrently from many processes.
        """
        with self._locked():
            self._start_locked()
        return self.url()

    def stop(self) -> None:
        """Fast shutdown (disconnects clients, no data loss); no-op if not running."""
        with self._locked():
            self._stop_locked()

    def restart(self) -> str:
        """Stop then start, under one lock; the socket path (hence URL) stays the same."""
        with self._locked():
            self._stop_locked()
            self._start_locked()
        return self.url()

    def init_standby(self, primary: EmbeddedPostgres) -> None:
        """Make this (empty) cluster a streaming standby of the running
        ``primary``: ``pg_basebackup -R`` (a copy of its data folder taken while
        it runs, with the WAL to make it consistent, and ``standby.signal`` plus
        ``primary_conninfo`` to follow it) over ``primary``'s unix socket. Into a
        sibling folder, then renamed, like initdb. ``start()`` then runs it."""
        with self._locked():
            self._ensure_binaries()
            self._prepare_folders()
            if self.is_initialized() or any(self.data_dir.iterdir()):
                raise EmbeddedPostgresError(f"{self.data_dir} is not empty: no base backup into it")
            took = self._fill_data_dir("pg_basebackup", lambda staging: [
                self.bin_dir / "pg_basebackup", "-D", staging, "-h", primary.socket_dir,
                "-p", str(primary.port), "-U", SUPERUSER, "-X", "stream", "-c", "fast", "-R",
                "--no-password"])
            logger.info("took a base backup of %s into %s (%.2fs)", primary.data_dir,
                        self.data_dir, took)

    def _start_locked(self) -> None:
        self._ensure_binaries()
        self._prepare_folders()
        if not self.is_running():
            if not self.is_initialized():
                self._initdb()
            self._launch()
        self._ensure_database()

    def _stop_locked(self) -> None:
        if not self.is_running():
            return
        started = time.monotonic()
        result = self.pg_ctl("-w", "-t", str(_START_TIMEOUT), "-m", "fast", "stop")
        if result.returncode != 0 and self.is_running():
            logger.warning("fast shutdown failed (%s); using immediate", result.stderr.strip())
            result = self.pg_ctl("-w", "-t", str(_START_TIMEOUT), "-m", "immediate", "stop")
            if result.returncode != 0 and self.is_running():
                raise EmbeddedPostgresError(f"pg_ctl stop failed: {result.stderr.strip()}")
        logger.info("stopped PostgreSQL in %s (%.2fs)", self.data_dir, time.monotonic() - started)

    # -- start steps -------------------------------------------------------------------

    def _ensure_binaries(self) -> None:
        """As root with an unreachable venv: copy the binaries once, atomically."""
        source = bundled_install()
        if self.bin_dir == source / "bin":
            return
        root, parts = install_parts(source)
        target = RUNTIME_ROOT.resolve() / self.bin_dir.relative_to(RUNTIME_ROOT.resolve()).parts[0]
        if target.exists():
            return
        mkdirs(RUNTIME_ROOT, 0o755)
        logger.warning(
            "the PostgreSQL binaries in %s are not reachable by %s; copying them to %s "
            "(no folder permissions are changed)",
            source,
            SERVER_OS_USER,
            target,
        )
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            for part in parts:
                shutil.copytree(part, tmp / part.relative_to(root), symlinks=True)
            make_world_readable(tmp)
            os.rename(tmp, target)  # atomic; fails if a concurrent copy won the race
        except OSError:
            if not target.exists():
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        version = run_as_server_user([self.bin_dir / "postgres", "--version"], timeout=60)
        if version.returncode != 0:
            raise EmbeddedPostgresError(f"copied binaries do not run: {version.stderr.strip()}")

    def _prepare_folders(self) -> None:
        """Create base, data, socket folders and the log; hand them to the server user."""
        if self._relocated:
            fresh = not self._base.exists()
            mkdirs(self._base, 0o755)
            if fresh or self._base not in _warned_relocations:
                _warned_relocations.add(self._base)
                # Loud the first time (the user must learn where the data went), then
                # once per process at info level: workers start by the dozen.
                logger.log(
                    logging.WARNING if fresh else logging.INFO,
                    "%s is not reachable by the server user %s (a parent folder lacks the "
                    "others-execute bit); keeping PostgreSQL data in %s instead. "
                    "No folder permissions were changed.",
                    self.home,
                    SERVER_OS_USER,
                    self._base,
                )
        else:
            mkdirs(self._base, 0o755 if self._as_root else None)
        if not self.data_dir.exists():
            self.data_dir.mkdir(mode=0o700)
            hand_over(self.data_dir)
        elif self._as_root and self.data_dir.stat().st_uid != ensure_server_user()[0]:
            logger.warning("handing %s over to %s", self.data_dir, SERVER_OS_USER)
            hand_over(self.data_dir, recursive=True)
        self._prepare_socket_dir()
        if not self.log_file.exists():
            self.log_file.touch(mode=0o600)
            hand_over(self.log_file)

    def _prepare_socket_dir(self) -> None:
        """0700 socket folder owned by the server user: trust auth makes it the gate."""
        expected = ensure_server_user()[0] if self._as_root else os.geteuid()
        with contextlib.suppress(FileExistsError):
            self.socket_dir.mkdir(mode=0o700)
            hand_over(self.socket_dir)
        st = self.socket_dir.lstat()
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise EmbeddedPostgresError(f"{self.socket_dir} is not a folder")
        if st.st_uid != expected:
            if not (self._as_root and st.st_uid == 0):
                raise EmbeddedPostgresError(
                    f"{self.socket_dir} belongs to uid {st.st_uid}, not {expected}; not using it"
                )
            hand_over(self.socket_dir)
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.chmod(self.socket_dir, 0o700)

    def _initdb(self) -> None:
        """initdb, with the superuser's password if there is one."""
        if any(self.data_dir.iterdir()):
            raise EmbeddedPostgresError(
                f"{self.data_dir} is not empty but has no PG_VERSION; move it away to start afresh"
            )
        with self._password_file() as extra:
            took = self._fill_data_dir("initdb", lambda staging: [
                self.bin_dir / "initdb", "-D", staging, "--auth=trust", *extra,
                "--encoding=UTF8", "--locale=C", "-U", SUPERUSER, "--no-instructions"])
        logger.info("initialized PostgreSQL %s cluster in %s (%.2fs)", POSTGRES_MAJOR,
                    self.data_dir, took)

    def _fill_data_dir(self, program: str,
                       command: Callable[[Path], Sequence[str | Path]]) -> float:
        """Run ``command(staging)`` (initdb, pg_basebackup) into a sibling folder
        of the data folder, then rename it into place: a crash never leaves a half
        cluster. The seconds it took."""
        staging = self._base / f"pgdata.{program}"
        shutil.rmtree(staging, ignore_errors=True)  # ours, from an interrupted run
        staging.mkdir(mode=0o700)
        hand_over(staging)
        started = time.monotonic()
        result = run_as_server_user(command(staging), timeout=300)
        if result.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            raise EmbeddedPostgresError(f"{program} failed: {result.stderr.strip()}")
        self.data_dir.rmdir()
        os.rename(staging, self.data_dir)
        return time.monotonic() - started

    @contextlib.contextmanager
    def _password_file(self) -> Iterator[list[str]]:
        """initdb's options for the superuser's password, if there is one: TCP
        connections need it (scram-sha-256), the socket does not. The file it
        reads it from lives for the initdb only, readable by the server user alone."""
        if self._password is None:
            yield []
            return
        fd, name = tempfile.mkstemp(prefix=".pwfile.", dir=self._base)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(self._password + "\n")
            hand_over(Path(name))
            yield ["--auth-host=scram-sha-256", f"--pwfile={name}"]
        finally:
            os.unlink(name)

    def _server_options(self) -> str:
        """The ``-o`` string for pg_ctl (it goes through /bin/sh, hence the quoting)."""
        settings = {
            "listen_addresses": "",  # unix socket only: nothing on the network
            "port": str(self.port),
            "unix_socket_directories": str(self.socket_dir),
            **SERVER_SETTINGS,
            **self.settings,
        }
        return " ".join(f"-c {shlex.quote(f'{k}={v}')}" for k, v in settings.items())

    def _clear_stale_lock_files(self) -> None:
        """Remove lock files whose pid is alive but is not our postmaster.

        PostgreSQL itself handles a *dead* pid; a zombie or a reused pid makes it refuse
        to start. We only delete once no process is attached to the old shared memory.
        """
        pid_file = self.data_dir / "postmaster.pid"
        pid = read_pid(pid_file)
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, 0)
            if shared_memory_in_use(pid_file) is not False:
                return  # unsure, or old backends still attached: leave it to postgres
            logger.warning("removing stale postmaster.pid (pid %d is not our postmaster)", pid)
            pid_file.unlink(missing_ok=True)
            socket_lock = self.socket_dir / f".s.PGSQL.{self.port}.lock"
            if read_pid(socket_lock) == pid:
                socket_lock.unlink(missing_ok=True)

    def _launch(self) -> None:
        if self.log_file.stat().st_size > _LOG_ROTATE_BYTES:
            os.replace(self.log_file, self.log_file.with_suffix(".log.1"))
            self.log_file.touch(mode=0o600)
            hand_over(self.log_file)
        version = (self.data_dir / "PG_VERSION").read_text().strip()
        if version != str(POSTGRES_MAJOR):
            raise EmbeddedPostgresError(
                f"{self.data_dir} holds a PostgreSQL {version} cluster, not {POSTGRES_MAJOR}"
            )
        deadline = time.monotonic() + _START_TIMEOUT
        started = time.monotonic()
        waited = False
        while True:
            if shared_memory_in_use(self.data_dir / "postmaster.pid") and (
                time.monotonic() < deadline
            ):
                # Backends of a killed postmaster still run (a busy query notices the
                # postmaster's death only when it next waits). Starting now would fail.
                if not waited:
                    logger.info("old PostgreSQL processes still use shared memory; waiting")
                waited = True
                time.sleep(0.2)
                continue
            self._clear_stale_lock_files()
            offset = self.log_file.stat().st_size
            result = self.pg_ctl(
                "-w",
                "-t",
                str(_START_TIMEOUT),
                "-l",
                str(self.log_file),
                "-o",
                self._server_options(),
                "start",
            )
            if result.returncode == 0:
                break
            with self.log_file.open(errors="replace") as log:
                log.seek(offset)
                new_log = log.read()
            if SHM_IN_USE in new_log and time.monotonic() < deadline:
                # Backends of a killed postmaster are still exiting.
                logger.info("old PostgreSQL processes still exiting; retrying start")
                time.sleep(0.2)
                continue
            raise EmbeddedPostgresError(
                f"pg_ctl start failed: {result.stdout.strip()} {result.stderr.strip()}\n"
                f"--- {self.log_file} ---\n{new_log[-4000:]}"
            )
        logger.info(
            "started PostgreSQL %s on %s (%.2fs)",
            POSTGRES_MAJOR,
            self.socket_dir,
            time.monotonic() - started,
        )

    def _ensure_database(self) -> None:
        """Create the ``jobqueue`` database if missing (we hold the lock: no race)."""
        query = f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE_NAME}'"
        deadline = time.monotonic() + _START_TIMEOUT
        while True:
            try:
                exists = self.psql(query, database="postgres")
                break
            except EmbeddedPostgresError as exc:
                # A server we did not start ourselves may still be in (crash) recovery.
                transient = any(m in str(exc) for m in _NOT_READY)
                if not transient or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        if exists != "1":
            self.psql(f'CREATE DATABASE "{DATABASE_NAME}"', database="postgres")
            logger.info("created database %s", DATABASE_NAME)
