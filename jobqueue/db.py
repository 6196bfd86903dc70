"""Where the database is and how to reach it: URLs and connections only.

A URL passed in wins, then `DATABASE_URL` (SQLAlchemy form,
`postgresql+asyncpg://…`; plain `postgresql://` and `postgres://` are
accepted). With neither, `database_url()` raises ConfigError: a library must
not start a database server behind its user's back. The `jobqueue` command
starts the embedded PostgreSQL 16 itself when `DATABASE_URL` is unset
(`jobqueue.embedded`, an optional extra).

A URL may name several servers, a primary and its standbys, in SQLAlchemy's
form (`?host=a:5432&host=b:5432`) or libpq's (`postgresql://a:5432,b:5432/db`,
turned into SQLAlchemy's). Every connection then goes to the first server
that fits `target_session_attrs`, which is `read-write` unless the URL says
otherwise (a worker must write), trying each server in turn for
`connect_timeout` seconds (libpq's names): after a failover it finds the
promoted standby. The hosts and ports are read by SQLAlchemy's own asyncpg
dialect, so raw connections and engines agree on what a URL names.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import asyncpg
import sqlalchemy.ext.asyncio
from sqlalchemy import URL, make_url
from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncEngine

from jobqueue.errors import is_connection_error, one_line


class ConfigError(ValueError):
    """A setting the user gave cannot work; the message says which and why."""


class NoServerError(ConnectionError):
    """None of a URL's servers took the connection (all down, or none of
    them fits `target_session_attrs`: the standby before its promotion)."""


#: What a ConfigError says when no database was named.
NO_DATABASE = ("no database: pass a URL or set DATABASE_URL (`jobqueue db up` starts the "
               "embedded PostgreSQL 16, `jobqueue db url` prints its URL)")
#: The server a URL with several hosts connects to, unless it says otherwise.
DEFAULT_SESSION_ATTRS = "read-write"
SESSION_ATTRS = ("any", "primary", "standby", "prefer-standby", "read-write", "read-only")
#: Seconds each server of a URL with several gets before the next is tried
#: (`connect_timeout` in the URL): a host that accepts TCP but never answers
#: (frozen, cut off) must not keep a worker from the promoted standby. A URL
#: with one host keeps asyncpg's own 60 s.
DEFAULT_CONNECT_TIMEOUT = 10.0
#: Parameters of ours that asyncpg.connect() does not take: read here, and
#: left out of the URL an engine or a pinned life hands to SQLAlchemy.
_OURS = ("connect_timeout",)
# libpq's several hosts in the netloc: scheme://[user[:password]@]h1[:p1],h2[:p2][/db][?query]
_LIBPQ_HOSTS = re.compile(r"^(?P<scheme>[^:/]+://)(?P<auth>[^@/]*@)?(?P<hosts>[^/?@]*,[^/?]*)"
                          r"(?P<rest>[/?].*)?$")
_DIALECT = PGDialect_asyncpg()
_PASSWORD_PARAM = re.compile(r"([?&]password=)[^&]*", re.IGNORECASE)


def database_url(url: str | None = None) -> str:
    """The SQLAlchemy URL to use, with the asyncpg driver: `url`, else
    `DATABASE_URL`, else a ConfigError (never a server started on the quiet)."""
    raw = url or os.environ.get("DATABASE_URL")
    if not raw:
        raise ConfigError(NO_DATABASE)
    return normalize_url(raw)


def redacted(raw: str) -> str:
    """`raw` with its password replaced by `***`, wherever it is (after the
    user, or a `password=` parameter): for messages about a URL that may not
    even parse, so SQLAlchemy's own masking cannot be used.

    A URL this is shown for is malformed, often because its password holds
    a `/`, `?` or `@` that should have been percent-encoded: so the user
    information ends at the last `@` of the whole URL, not at the first `/`
    or `?`. When a later `@` (in a query value) makes that too far, more is
    hidden than the password, never less."""
    scheme, sep, rest = raw.partition("://")
    if sep:
        userinfo, at, after = rest.rpartition("@")
        if at and ":" in userinfo:
            raw = f"{scheme}{sep}{userinfo.split(':', 1)[0]}:***@{after}"
    return _PASSWORD_PARAM.sub(r"\1***", raw)


def normalize_url(raw: str) -> str:
    """`raw` as the SQLAlchemy URL jobqueue uses everywhere: the asyncpg
    driver, several hosts in SQLAlchemy's form with `target_session_attrs`
    (read-write unless given). A ConfigError, in one line, for a URL that
    cannot work."""
    try:
        parsed = make_url(_libpq_hosts(raw))
    except (ArgumentError, ValueError) as e:
        raise ConfigError(f"DATABASE_URL is not a database URL: {redacted(raw)!r}") from e
    backend = parsed.get_backend_name()
    if backend not in ("postgresql", "postgres"):
        raise ConfigError(f"DATABASE_URL must point to PostgreSQL, not {backend!r}")
    parsed = parsed.set(drivername="postgresql+asyncpg")
    if len(servers(parsed)) > 1 and "target_session_attrs" not in parsed.query:
        parsed = parsed.update_query_dict({"target_session_attrs": DEFAULT_SESSION_ATTRS})
    _session_attrs(parsed)
    _connect_timeout(parsed)
    return parsed.render_as_string(hide_password=False)


def _libpq_hosts(raw: str) -> str:
    """libpq's `postgresql://u@a:5432,b:5433/db` (which SQLAlchemy cannot
    parse) in SQLAlchemy's form, `postgresql://u@/db?host=a:5432&host=b:5433`;
    anything else as it was. A host without a port gets 5432."""
    found = _LIBPQ_HOSTS.match(raw)
    if not found:
        return raw
    hosts = [h if ":" in h else f"{h}:5432" for h in found["hosts"].split(",")]
    path, _, query = (found["rest"] or "").partition("?")
    query = "&".join([*(f"host={h}" for h in hosts), *([query] if query else [])])
    return f"{found['scheme']}{found['auth'] or ''}{path or '/'}?{query}"


def servers(url: str | URL) -> list[tuple[str | None, int | None]]:
    """The (host, port) pairs a URL names, in the order they are tried; one
    pair (maybe `(None, None)`: asyncpg's defaults) for a single server. A
    host is a name, an address or a unix-socket folder."""
    opts = _dialect_args(make_url(url) if isinstance(url, str) else url)
    hosts, ports = opts.get("host"), opts.get("port")
    if isinstance(hosts, list):
        return list(zip(hosts, ports or [], strict=True))
    return [(hosts, ports)]


def where(url: str | URL) -> str:
    """The servers a URL names, as `host:port` for a person to check (never
    its user or password): what a connection error should say."""
    try:
        pairs = servers(url)
    except (ConfigError, ArgumentError, ValueError):
        return "the server DATABASE_URL names"
    return ", ".join(f"the socket in {host}" if str(host).startswith("/")
                     else f"{host or 'localhost'}:{port or 5432}" for host, port in pairs)


def _dialect_args(parsed: URL) -> dict[str, Any]:
    """asyncpg.connect() arguments as SQLAlchemy's asyncpg dialect reads them."""
    try:
        _, opts = _DIALECT.create_connect_args(parsed.difference_update_query(_OURS))
    except (ArgumentError, ValueError) as e:
        raise ConfigError(f"DATABASE_URL names its servers in a way that cannot work: {e}") from e
    return opts


def _session_attrs(parsed: URL) -> str | None:
    value = parsed.query.get("target_session_attrs")
    if value is not None and value not in SESSION_ATTRS:
        raise ConfigError(f"target_session_attrs must be one of {', '.join(SESSION_ATTRS)}, "
                          f"not {value!r}")
    return value if isinstance(value, str) else None


def _connect_timeout(parsed: URL) -> float | None:
    value = parsed.query.get("connect_timeout")
    if value is None:
        return None
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise ConfigError(f"connect_timeout must be a positive number of seconds, not {value!r}")
    return seconds


def sync_url(url: str) -> str:
    """The same database for psycopg 3, the driver of sync handlers' threads
    (`worker/threads.py`). libpq reads `?host=/folder` (a unix socket folder,
    as the embedded server uses), several `host`s and `target_session_attrs`
    as asyncpg does; asyncpg's `ssl=` is libpq's `sslmode=`."""
    parsed = make_url(normalize_url(url))
    query = dict(parsed.query)
    if "ssl" in query:
        ssl = query.pop("ssl")
        query.setdefault("sslmode", {"true": "require", "false": "disable"}.get(
            str(ssl).lower(), ssl))
    return parsed.set(drivername="postgresql+psycopg", query=query).render_as_string(
        hide_password=False)


def asyncpg_connect_args(url: str) -> dict[str, Any]:
    """asyncpg.connect() keyword arguments for a SQLAlchemy URL: several
    hosts as lists (asyncpg tries them in turn, within one `timeout`; `connect`
    gives each its own)."""
    parsed: URL = make_url(url)
    opts = _dialect_args(parsed)
    args: dict[str, Any] = {key: opts.get(key)
                            for key in ("user", "password", "database", "host", "port")}
    query = parsed.query
    if "ssl" in query or "sslmode" in query:
        args["ssl"] = query.get("ssl") or query.get("sslmode")
    args["target_session_attrs"] = _session_attrs(parsed)
    return {k: v for k, v in args.items() if v is not None}


async def connect(url: str, application_name: str = "jobqueue",
                  settings: Mapping[str, str] | None = None,
                  command_timeout: float | None = None) -> asyncpg.Connection:
    """A dedicated connection, never pooled: session-level locks and LISTEN
    live on a connection, so the connection must stay ours. `settings`:
    server settings for its session (a `statement_timeout`, say);
    `command_timeout`: seconds after which the client gives up on a
    statement the server never answers."""
    conn, _ = await connect_server(url, application_name, settings, command_timeout)
    return conn


async def connect_server(url: str, application_name: str = "jobqueue",
                         settings: Mapping[str, str] | None = None,
                         command_timeout: float | None = None
                         ) -> tuple[asyncpg.Connection, str]:
    """`connect`, and the URL of the one server it reached (`pin`): a worker
    keeps the rest of its life's connections on that server.

    With several servers, each is tried in turn for `connect_timeout`
    seconds, as libpq does (asyncpg's own list shares one timeout among
    them, so a host that never answers would use it all up). A server that
    refuses, does not answer or does not fit `target_session_attrs` (a
    standby, for `read-write`) passes the turn to the next; NoServerError,
    a ConnectionError, when none takes it."""
    parsed = make_url(url)
    args = asyncpg_connect_args(url)
    args["server_settings"] = {**(settings or {}), "application_name": application_name}
    args["command_timeout"] = command_timeout
    timeout = _connect_timeout(parsed)
    candidates = servers(parsed)
    if len(candidates) == 1:
        if timeout is not None:
            args["timeout"] = timeout
        return await asyncpg.connect(**args), pin(url, *candidates[0])
    args["timeout"] = timeout or DEFAULT_CONNECT_TIMEOUT
    attrs = args.pop("target_session_attrs", DEFAULT_SESSION_ATTRS)
    # prefer-standby, one server at a time: a standby first, else any server.
    rounds = ["standby", "any"] if attrs == "prefer-standby" else [attrs]
    errors: list[tuple[str, BaseException]] = []
    for wanted in rounds:
        for host, port in candidates:
            try:
                conn = await asyncpg.connect(**{**args, "host": host, "port": port},
                                             target_session_attrs=wanted)
            except Exception as exc:  # the next server's turn, as libpq does
                errors.append((f"{host}:{port}", exc))
                continue
            return conn, pin(url, host, port)
    if not any(is_connection_error(e) for _, e in errors):
        raise errors[-1][1]  # the same refusal everywhere (a password): say it as it is
    tried = "; ".join(
        f"{where} no answer within {args['timeout']:g}s" if isinstance(e, TimeoutError)
        else f"{where} {one_line(e)}" for where, e in errors)
    raise NoServerError(f"no server took the connection ({attrs}): {tried}") from errors[-1][1]


def pin(url: str, host: str | None, port: int | None) -> str:
    """`url` narrowed to one of its servers (its other settings kept, the
    session attributes too): for connections that must reach the server
    another one reached. Also what SQLAlchemy can be handed as it is."""
    parsed = make_url(url).difference_update_query(_OURS)
    if len(servers(parsed)) == 1:
        return parsed.render_as_string(hide_password=False)
    query = {"host": host} if port is None else {"host": host, "port": str(port)}
    return (parsed.difference_update_query(["host", "port"]).set(host=None, port=None)
            .update_query_dict({k: v for k, v in query.items() if v is not None})
            .render_as_string(hide_password=False))


def create_engine(url: str | None = None, **kwargs: Any) -> AsyncEngine:
    """An engine on the configured database, for sessions and lanes. With
    several servers its connections come from `connect`, so they look for
    the read-write one the same way (each server for `connect_timeout`).

    `create_async_engine` is looked up when called, not imported by name:
    OpenTelemetry's SQLAlchemy instrumentation replaces it, and a worker's
    engines (made here) must trace a handler's statements once it has.

    Its errors and its log leave out the values statements were given
    (`hide_parameters=True` unless passed): a payload or a handler's data
    is not an error's to repeat (`redact.py`)."""
    create_async_engine = sqlalchemy.ext.asyncio.create_async_engine
    kwargs.setdefault("pool_pre_ping", False)
    kwargs.setdefault("hide_parameters", True)
    target = database_url(url)
    parsed = make_url(target)
    if len(servers(parsed)) > 1:
        async def connect_any() -> asyncpg.Connection:
            return await connect(target)
        kwargs.setdefault("async_creator", connect_any)
        return create_async_engine(target, **kwargs)
    timeout = _connect_timeout(parsed)
    if timeout is not None:
        kwargs["connect_args"] = {"timeout": timeout, **kwargs.get("connect_args", {})}
    return create_async_engine(pin(target, None, None), **kwargs)


def with_database(url: str, name: str) -> str:
    """The same server, another database."""
    return make_url(url).set(database=name).render_as_string(hide_password=False)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def create_database(url: str, name: str, *, template: str | None = None,
                          replace: bool = False) -> str:
    """Create database `name` on `url`'s server (a copy of `template` if given)
    and return its URL. Tests and benchmarks get databases of their own."""
    admin = await connect(with_database(url, "postgres"), application_name="jobqueue admin")
    try:
        if replace:
            await admin.execute(f"DROP DATABASE IF EXISTS {_quote(name)} WITH (FORCE)")
        suffix = f" TEMPLATE {_quote(template)}" if template else ""
        await admin.execute(f"CREATE DATABASE {_quote(name)}{suffix}")
    finally:
        await admin.close()
    return with_database(url, name)


async def drop_database(url: str, name: str) -> None:
    admin = await connect(with_database(url, "postgres"), application_name="jobqueue admin")
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {_quote(name)} WITH (FORCE)")
    finally:
        await admin.close()
