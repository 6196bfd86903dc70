"""URLs that name several servers (a primary and its standbys): how they are
read, and that every kind of connection jobqueue opens goes to the first
server that takes it (raw asyncpg, SQLAlchemy engines, the CLI).

The connection tests put the test server behind hosts that cannot serve: a
closed port, and a listener that accepts TCP and never answers, as a frozen
or cut-off server does."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import asyncpg
import pytest
from sqlalchemy import make_url, text
from sqlalchemy.ext.asyncio import create_async_engine

from jobqueue import db
from jobqueue.errors import is_connection_error, is_timeout
from tests.conftest import run_cli

TWO = "postgresql+asyncpg://app:s3cret@/jobs?host=db1.example:5432&host=db2.example:5433"


def test_two_hosts_in_sqlalchemy_form_are_read_in_order_and_asked_for_read_write() -> None:
    url = db.normalize_url(TWO)
    assert db.servers(url) == [("db1.example", 5432), ("db2.example", 5433)]
    assert make_url(url).query["target_session_attrs"] == "read-write"
    args = db.asyncpg_connect_args(url)
    assert args == {"user": "app", "password": "s3cret", "database": "jobs",
                    "host": ["db1.example", "db2.example"], "port": [5432, 5433],
                    "target_session_attrs": "read-write"}
    # SQLAlchemy's own engine reads the same servers out of it.
    engine_args = create_async_engine(url).dialect.create_connect_args(make_url(url))[1]
    assert (engine_args["host"], engine_args["port"]) == (args["host"], args["port"])


@pytest.mark.parametrize("raw", [
    "postgresql://app:s3cret@db1.example:5432,db2.example:5433/jobs",  # libpq's form
    "postgres://app:s3cret@/jobs?host=db1.example,db2.example&port=5432,5433",
    "postgresql+asyncpg://app:s3cret@/jobs?host=db1.example:5432&host=db2.example:5433"
    "&target_session_attrs=read-write",
])
def test_every_form_of_two_hosts_means_the_same(raw: str) -> None:
    url = db.normalize_url(raw)
    assert db.servers(url) == db.servers(db.normalize_url(TWO))
    assert db.asyncpg_connect_args(url) == db.asyncpg_connect_args(db.normalize_url(TWO))


def test_libpq_form_keeps_the_rest_of_the_url() -> None:
    url = db.normalize_url("postgresql://app:p%40ss@a,b:6000/jobs?sslmode=require"
                           "&target_session_attrs=primary&connect_timeout=3")
    parsed = make_url(url)
    assert db.servers(url) == [("a", 5432), ("b", 6000)]  # a host without a port: 5432
    assert (parsed.username, parsed.password, parsed.database) == ("app", "p@ss", "jobs")
    assert parsed.query["target_session_attrs"] == "primary"  # given: kept
    assert db.asyncpg_connect_args(url)["ssl"] == "require"


def test_unix_socket_folders_can_be_hosts_too() -> None:
    url = db.normalize_url("postgresql://postgres@/jobqueue?host=/run/a:5432&host=/run/b:5433")
    assert db.servers(url) == [("/run/a", 5432), ("/run/b", 5433)]


def test_one_host_urls_are_as_they_were() -> None:
    embedded = "postgresql+asyncpg://postgres@/jobqueue?host=/srv/jobqueue/run"
    assert make_url(db.normalize_url(embedded)) == make_url(embedded)
    assert db.asyncpg_connect_args(embedded) == {"user": "postgres", "database": "jobqueue",
                                                 "host": "/srv/jobqueue/run"}
    plain = db.normalize_url("postgresql://u:p@localhost:5433/app")
    assert plain == "postgresql+asyncpg://u:p@localhost:5433/app"
    assert db.servers(plain) == [("localhost", 5433)]


@pytest.mark.parametrize(("raw", "says"), [
    ("postgresql://u@/db?host=a:5432&host=b", "All ports are required"),
    ("postgresql://u@/db?host=a,b,c&port=1,2", "number of hosts and ports don't match"),
    ("postgresql://u@a:x,b:5432/db", "non-integer port"),
    ("postgresql://u@a,b/db?target_session_attrs=writable", "target_session_attrs must be"),
    ("postgresql://u@a,b/db?connect_timeout=soon", "connect_timeout must be"),
    ("postgresql://u@a/db?connect_timeout=0", "connect_timeout must be"),
])
def test_urls_that_cannot_work_are_refused_in_one_line(raw: str, says: str) -> None:
    with pytest.raises(db.ConfigError, match=says) as refused:
        db.normalize_url(raw)
    assert "\n" not in str(refused.value)


def test_a_pinned_url_names_one_server_and_keeps_the_rest() -> None:
    url = db.normalize_url(TWO + "&connect_timeout=2")
    pinned = db.pin(url, "db2.example", 5433)
    assert db.servers(pinned) == [("db2.example", 5433)]
    parsed = make_url(pinned)
    assert (parsed.username, parsed.password, parsed.database) == ("app", "s3cret", "jobs")
    assert parsed.query["target_session_attrs"] == "read-write"
    assert "connect_timeout" not in parsed.query  # asyncpg would refuse it
    create_async_engine(pinned).dialect.create_connect_args(parsed)  # SQLAlchemy takes it


# -- connecting -------------------------------------------------------------------------


@pytest.fixture
def dead_hosts() -> Iterator[list[str]]:
    """Two hosts that cannot serve: a closed port, and one that accepts TCP
    (the kernel completes the handshake) but never answers."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        yield [f"127.0.0.1:{closed.getsockname()[1]}", f"127.0.0.1:{silent.getsockname()[1]}"]
    finally:
        closed.close()
        silent.close()


def _behind(db_url: str, hosts: list[str], **query: str) -> str:
    """`db_url`'s server as the last of `hosts`."""
    (host, port), = db.servers(db_url)
    parsed = make_url(db_url).difference_update_query(["host", "port"]).set(host=None, port=None)
    return db.normalize_url(parsed.update_query_dict(
        {"host": [*hosts, f"{host}:{port or 5432}"], **query}).render_as_string(
            hide_password=False))


async def test_a_connection_skips_servers_that_refuse_or_never_answer(
        db_url: str, dead_hosts: list[str]) -> None:
    url = _behind(db_url, dead_hosts, connect_timeout="0.5")
    started = time.monotonic()
    conn, server = await db.connect_server(url)
    try:
        assert await conn.fetchval("SELECT current_database()") == make_url(db_url).database
        assert db.servers(server) == db.servers(url)[-1:]  # pinned to the one that took it
    finally:
        await conn.close()
    # The silent host had its half second, not asyncpg's 60 s.
    assert time.monotonic() - started < 30


async def test_none_fits_is_a_connection_error_naming_every_server(
        db_url: str, dead_hosts: list[str]) -> None:
    url = _behind(db_url, dead_hosts, connect_timeout="0.5", target_session_attrs="standby")
    with pytest.raises(db.NoServerError) as none:
        await db.connect(url)
    message = str(none.value)
    assert "ConnectionRefusedError" in message and "no answer within 0.5s" in message
    assert "TargetServerAttributeNotMatched" in message  # the server itself: no standby
    assert is_connection_error(none.value)  # a worker retries with backoff


async def test_engines_and_the_cli_take_several_hosts_too(db_url: str,
                                                         dead_hosts: list[str]) -> None:
    url = _behind(db_url, dead_hosts, connect_timeout="0.5")
    engine = db.create_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("INSERT INTO jobs (job_type) VALUES ('noop')"))
    finally:
        await engine.dispose()
    status = run_cli("status", "--json", url=url)
    assert status.returncode == 0, status.stderr
    assert '"pending": 1' in status.stdout


async def test_a_write_refused_as_read_only_means_look_for_another_server(
        conn: asyncpg.Connection) -> None:
    """What a standby answers a write with (25006): a reason to start over
    and look for the primary, not a job's failure."""
    await conn.execute("SET default_transaction_read_only = on")
    with pytest.raises(asyncpg.ReadOnlySQLTransactionError) as refused:
        await conn.execute("INSERT INTO jobs (job_type) VALUES ('noop')")
    assert is_connection_error(refused.value)
    assert not is_timeout(refused.value)


@pytest.mark.parametrize("url", [
    "postgresql://alice:S3CRETPW@127.0.0.1:notaport/db",
    "postgresql://alice:S3CRETPW@[::1/db",
    # Issue 49: a `/` or `?` in the password ended the user information
    # there, and the whole password was printed.
    "postgresql://alice:S3C/RETPW@127.0.0.1:notaport/db",
    "postgresql://alice:S3C?RETPW@127.0.0.1:notaport/db",
])
@pytest.mark.parametrize("command", [["status"], ["worker", "--burst"], ["serve"]])
def test_a_malformed_url_is_named_without_its_password(url: str, command: list[str]) -> None:
    """The one-line error quotes the URL so the reader can see what is wrong
    with it, but not its password (issue 31, item 6)."""
    done = run_cli(*command, url=url)
    assert done.returncode == 1 and "S3CRETPW" not in done.stdout + done.stderr
    assert "DATABASE_URL is not a database URL: 'postgresql://alice:***@" in done.stderr
    assert done.stderr.strip().count("\n") == 0


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://alice:p@ss:w@rd@h/db?x=1", "postgresql://alice:***@h/db?x=1"),
    ("postgresql://h/db?user=a&password=S3CRET&sslmode=require",
     "postgresql://h/db?user=a&password=***&sslmode=require"),
    ("postgresql://alice@h/db", "postgresql://alice@h/db"),
    ("not a url", "not a url"),
    ("postgresql://alice:pa/ss@h:5432/db", "postgresql://alice:***@h:5432/db"),
    ("postgresql://alice:p?w=1&x@h/db?sslmode=require",
     "postgresql://alice:***@h/db?sslmode=require"),
    ("postgresql://alice:p/?@#s@h/db", "postgresql://alice:***@h/db"),
    ("postgresql://h:5432/db", "postgresql://h:5432/db"),
    # A later `@` hides more than the password, never less.
    ("postgresql://alice:p/w@h/db?application_name=a@b", "postgresql://alice:***@b"),
])
def test_redacted_hides_a_password_wherever_it_is(url: str, shown: str) -> None:
    assert db.redacted(url) == shown
