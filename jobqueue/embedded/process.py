"""Is a postmaster alive, and whose is it: reading PostgreSQL's lock files,
/proc and SysV shared memory, so that a dead, zombie or reused pid never
passes for our server and a new one never starts beside a live one.
"""

from __future__ import annotations

import os
from pathlib import Path

# "pre-existing shared memory block ... is still in use": children of a SIGKILLed
# postmaster have not exited yet. They do within moments; we retry until then.
SHM_IN_USE = "is still in use"


class EmbeddedPostgresError(RuntimeError):
    """A bundled PostgreSQL program failed; the message carries its output."""


def read_pid(lock_file: Path) -> int | None:
    """First line of a PostgreSQL lock file (postmaster.pid, .s.PGSQL.5432.lock)."""
    try:
        first = lock_file.read_text().split("\n", 1)[0].strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return abs(int(first))
    except ValueError:
        return None


def process_state(pid: int) -> str | None:
    """Linux process state letter ('R', 'S', 'Z'...), None if gone or no procfs."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()[0]


def is_postmaster_of(pid: int, data_dir: Path) -> bool:
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
    if process_state(pid) in (None, "Z", "X"):
        return False
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return True  # cannot tell: be conservative, never start a second postmaster
    return Path(cwd) == data_dir.resolve()


def shared_memory_in_use(pid_file: Path) -> bool | None:
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


def child_pids(pid: int) -> list[int]:
    """The live children of ``pid`` (a postmaster's backends and helpers), read
    from /proc; [] where there is no procfs."""
    found = []
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 1 and fields[1] == str(pid):
            found.append(int(entry.parent.name))
    return found
