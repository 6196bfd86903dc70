"""The system account the server runs as when jobqueue runs as root
(PostgreSQL refuses to run as root), and handing files over to it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from jobqueue.embedded.process import EmbeddedPostgresError

logger = logging.getLogger("jobqueue.embedded")

#: System account that runs the server when we are root (PostgreSQL refuses root).
SERVER_OS_USER = "jobqueue-pg"


def ensure_server_user() -> tuple[int, int]:
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


def hand_over(path: Path, *, recursive: bool = False) -> None:
    """Give `path` (and, if `recursive`, everything under it) to the server
    user; nothing to do unless we are root, when the server runs as ourselves."""
    if os.geteuid() != 0:
        return
    uid, gid = ensure_server_user()
    if path.lstat().st_uid == uid and not recursive:
        return
    paths = [path]
    if recursive:
        for root, dirs, files in os.walk(path):
            paths.extend(Path(root, n) for n in dirs + files)
    for p in paths:
        os.lchown(p, uid, gid)


def run_as_server_user(
    args: Sequence[str | Path], *, timeout: float | None = None
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
    if os.geteuid() == 0:
        uid, gid = ensure_server_user()
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
