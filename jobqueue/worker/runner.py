"""The worker: one active runner and standbys (or, with `shared`, all of them
at once), each living through connections that may drop.

A worker's life, top-down:

1. **Announce.** Open three dedicated connections (never pooled). On the
   *control* connection take a session-level advisory lock on a fresh random
   id: as long as it exists the worker is alive, and PostgreSQL drops it the
   instant the connection dies. On the *monitor* connection register a row in
   `jobqueue_workers` and start the leader's loop (rescue, pruning); on the
   *heartbeat* connection, the heartbeat and fencing loop (`upkeep.py`).
2. **Contest.** In exclusive mode, block in `pg_advisory_lock` for the active
   lock: standbys wait inside PostgreSQL and the first gets it the moment the
   holder's connection ends (a crash), or its backends are terminated (a hang,
   fenced by a standby once its heartbeat is older than the lease). In shared
   mode skip this: every worker works, SKIP LOCKED shares the jobs.
3. **Work.** LISTEN for new jobs, rescue the jobs of dead workers, run
   the lanes (`lane.py`: `concurrency` of them, or as many as `queues`
   asks for), each given the config, a `Life` and the queues it serves. A
   worker takes only jobs of the types it has handlers for; it says which
   (and which queues) in its `jobqueue_workers` row. Sync (plain `def`)
   handlers' jobs are claimed by a lane of their own and run in threads
   (`threads.py`); the other lanes never see them.
4. **Stop or start over.** SIGTERM: stop claiming, let running handlers finish
   within the grace period, hand back what did not start; a second signal or
   the end of the grace period abandons running handlers (their transactions
   roll back, their jobs go back without counting an attempt). A lost
   connection, a server that stops answering (the upkeep connections' client
   timeout) or a fencing: cut everything, wait (with backoff), and live again
   under a new id. A life's connections all go to the server its first one
   reached, so with a primary and standbys in the URL the next life follows a
   failover to whichever server takes writes then.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import secrets
import signal
import socket
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg
from sqlalchemy import Engine as SyncEngine
from sqlalchemy.ext.asyncio import AsyncEngine

from jobqueue import db
from jobqueue.errors import Backoff, is_connection_error, is_timeout, one_line
from jobqueue.registry import HandlerRegistry, handlers
from jobqueue.schema import REVISION
from jobqueue.schema.locks import (
    ACTIVE_KEY,
    CANCEL_PREFIX,
    CANCELLED,
    CHANNEL,
    LOCK_CLASS,
    WORKER_LOCK_CLASS,
)
from jobqueue.schema.queries import queries
from jobqueue.worker import upkeep
from jobqueue.worker.alone import ALONE, AloneGate
from jobqueue.worker.book import SETTINGS_CHANGED, QueueBook
from jobqueue.worker.cancels import Released
from jobqueue.worker.config import WorkerConfig
from jobqueue.worker.doorbell import Doorbell
from jobqueue.worker.executor import AsyncExecutor
from jobqueue.worker.floors import Floors
from jobqueue.worker.handler import lane_engine
from jobqueue.worker.lane import Lane
from jobqueue.worker.life import Life
from jobqueue.worker.pool import ThreadPool
from jobqueue.worker.stats import WorkerStats
from jobqueue.worker.threads import ThreadExecutor, thread_engine
from jobqueue.worker.upkeep import Fenced, Heartbeat, Leader, rescue

logger = logging.getLogger("jobqueue.worker")


class _LifeOver(Exception):
    """This life's connections cannot go on (lost, or fenced): start over."""


class JobRunner:
    """Runs jobs until stopped; `await runner.run()` returns the stats report.

    database_url: where the jobs are; None: `DATABASE_URL`, and with neither
        `run()` raises `ConfigError` (the library never starts a server; the
        `jobqueue` command starts the embedded one itself).
    registry: the handlers, by job type (`jobqueue.handlers` by default).
    config: a `WorkerConfig`, or its fields as keyword arguments (`settings`):
        concurrency, batch_size, quick_batch, savepoints, shared, lease,
        poll_interval, grace_period, retry_policy, burst, keep_completed,
        keep_failed, archive_after, summary_interval, threads (see `WorkerConfig` for each).
    install_signal_handlers: SIGTERM and SIGINT call `stop()` while `run()` runs.
    """

    def __init__(
        self,
        database_url: str | None = None,
        *,
        registry: HandlerRegistry = handlers,
        config: WorkerConfig | None = None,
        install_signal_handlers: bool = True,
        **settings: Any,
    ) -> None:
        if config is not None and settings:
            raise TypeError("pass a WorkerConfig or its settings, not both")
        self.config = config if config is not None else WorkerConfig(**settings)
        self.database_url = database_url
        self.registry = registry
        #: Job types that failed after writing without a savepoint: they run
        #: in savepoints from then on (`savepoints="auto"`).
        self.isolated_types: set[str] = set()
        self.install_signal_handlers = install_signal_handlers

        self.worker_id = 0
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self.state = "new"
        self.stats = WorkerStats()
        self.was_active = False
        self.bell = Doorbell()
        #: The queues as this worker sees them, shared by its lanes.
        self.book = QueueBook(self.config.poll_interval)
        #: Where this life's lanes claim from (`floors.py`).
        self.floors = Floors()
        #: The job types it claims: those with handlers when its life began.
        self.job_types: list[str] = []
        #: Where sync (plain `def`) handlers run, for the runner's whole life.
        self.threads = ThreadPool(self.config.threads)
        #: The monitor connection serves one statement at a time: the leader's
        #: chores and the runner's hand-backs take turns.
        self.monitor_lock = asyncio.Lock()
        self._stop_requested = asyncio.Event()
        self._abandon = asyncio.Event()
        self._active = asyncio.Event()
        self._monitor: asyncpg.Connection | None = None
        self._connections: list[asyncpg.Connection] = []  # this life's own (not the lanes')
        self._lanes: list[Lane] = []  # this life's, while they work
        self._ledger: asyncpg.Connection | None = None  # where quick batches are written down
        self._ledger_lock = asyncio.Lock()
        #: Where each lane's row in the ledger is (its ctid), for the next batch to delete.
        self._ledger_rows: dict[int, Any] = {}
        self.alone = AloneGate()  # this life's: where lanes make room for lone jobs
        #: This life's jobs let go still waiting lately (`cancels.py`).
        self.released = Released()
        self._sending: set[asyncio.Task[None]] = set()  # cancels being sent again

    # -- control from outside -------------------------------------------------

    def stop(self) -> None:
        """Ask the worker to stop: the first call is graceful, a second abandons
        running handlers at once (their jobs go back to the queue)."""
        if self._stop_requested.is_set():
            if not self._abandon.is_set():
                logger.warning("second stop request: abandoning running jobs",
                               extra={"event": "worker_abandoning", "worker_id": self.worker_id})
                self._abandon.set()
            return
        grace = self.config.grace_period
        logger.info("stop requested: finishing running jobs (grace %.1fs)", grace,
                    extra={"event": "worker_stopping", "worker_id": self.worker_id,
                           "grace_period_s": grace})
        self._stop_requested.set()
        self.bell.ring()

    async def wait_active(self) -> None:
        """Return once this runner works (active, or shared): for tests and tools."""
        await self._active.wait()

    @property
    def stopping(self) -> bool:
        return self._stop_requested.is_set()

    @property
    def aborting(self) -> bool:
        """Lanes are being cut off on purpose: their errors are expected."""
        return self._abandon.is_set()

    @property
    def role(self) -> str:
        if self.config.shared:
            return "shared"
        return "active" if self._active.is_set() else "standby"

    # -- the life of a worker -------------------------------------------------

    async def run(self) -> dict[str, Any]:
        url = db.database_url(self.database_url)
        if not len(self.registry):
            # It would take the active role and run nothing, while a worker
            # that has the handlers stood by behind it.
            raise db.ConfigError(
                "no handlers are registered, so this worker could run no job: import the "
                "modules that register them (`jobqueue worker --import myapp.jobs`)")
        restore = self._install_signals()
        backoff = Backoff()
        server = db.where(url)
        try:
            while not self.stopping:
                try:
                    await self._live(url)
                    break
                except _LifeOver as over:
                    if self.stopping:
                        break
                    delay = backoff.next()
                    self.state = "reconnecting"
                    logger.warning("worker %d: %s (PostgreSQL at %s); starting over in %.2fs",
                                   self.worker_id, over, server, delay,
                                   extra={"event": "worker_restarting",
                                          "worker_id": self.worker_id, "error": str(over),
                                          "server": server, "delay_s": round(delay, 3)})
                    await self.sleep_unless_stopping(delay)
                    if self._active.is_set():
                        backoff.reset()
                        self._active.clear()
            return self._finish()
        finally:
            self.threads.close()
            restore()

    async def _live(self, url: str) -> None:
        """One life: announce, contest, work. Returns when stopped; raises
        _LifeOver when a connection is lost or this worker was fenced.
        Everything it opens is closed, in reverse order, when it ends."""
        self._abandon.clear()
        self.alone.close()
        self.alone = AloneGate()
        async with contextlib.AsyncExitStack() as stack:
            try:
                # The rest of this life's connections go where the first one
                # did: with several servers in the URL, locks, upkeep and
                # lanes must be on one of them.
                control, url = await self._announce(url)
                self._connections = [control]
                stack.push_async_callback(self._close_control, control)
                if not await self._await_schema(control):
                    return
                guards = await self._start_upkeep(stack, control, url)
                if not await self._contest(control, guards):
                    return
                await self._activate(control)
                sync_types = [t for t in self.job_types if self.registry.is_sync(t)]
                engine, sync_engine = self._engines(stack, url, sync_types)
                await self._work(engine, guards, sync_types, sync_engine)
            except Exception as exc:
                over = self._life_over(exc)
                if over is None:
                    raise
                raise over from exc
            finally:
                self._connections = []

    async def _start_upkeep(self, stack: contextlib.AsyncExitStack,
                            control: asyncpg.Connection, url: str) -> list[asyncio.Future[Any]]:
        """Open the life's other connections (monitor, heartbeat, ledger),
        register the worker, and start what guards the life: the heartbeat,
        the leader's upkeep, and the control connection's end."""
        config = self.config
        lost = asyncio.Event()
        control.add_termination_listener(lambda _: lost.set())
        monitor = self._monitor = await upkeep.connect(url, self._app_name("monitor"), config)
        stack.push_async_callback(self._close_monitor, monitor)
        self._connections.append(monitor)
        self.job_types = list(self.registry)
        await queries["register_worker"].fetch(
            monitor, id=self.worker_id, name=self.name,
            mode="shared" if config.shared else "exclusive",
            queues=None if config.served is None else list(config.served),
            job_types=self.job_types)
        beating = await upkeep.connect(url, self._app_name("heartbeat"), config)
        stack.push_async_callback(_close, beating)
        self._connections.append(beating)
        self._ledger = await upkeep.connect(url, self._app_name("ledger"), config)
        stack.push_async_callback(_close, self._ledger)
        self._connections.append(self._ledger)
        heartbeat = Heartbeat(config, beating, self.worker_id, lambda: self.role, self.stats)
        leader = Leader(config, monitor, self.worker_id, self.stats, self.monitor_lock,
                        schedules=self.registry.schedules)
        guards: list[asyncio.Future[Any]] = [asyncio.create_task(heartbeat.run_forever()),
                                             asyncio.create_task(leader.run_forever()),
                                             asyncio.ensure_future(lost.wait())]
        for guard in guards:
            stack.push_async_callback(_cancel, guard)
        return guards

    def _engines(self, stack: contextlib.AsyncExitStack, url: str, sync_types: list[str]
                 ) -> tuple[AsyncEngine, SyncEngine | None]:
        """The lanes' engine, and the threads' when there are sync handlers."""
        config = self.config
        engine = lane_engine(url, len(config.lane_queues) + bool(sync_types),
                             self._app_name("lane"))
        stack.push_async_callback(engine.dispose)
        if not sync_types:
            return engine, None
        sync_engine = thread_engine(url, config.threads, self._app_name("lane-thread"))
        stack.push_async_callback(asyncio.to_thread, sync_engine.dispose)
        return engine, sync_engine

    def _life_over(self, exc: Exception) -> _LifeOver | None:
        """What ends this life and starts another: a fencing, or a lost
        connection. A connection cut under a query can surface as a protocol
        error ("another operation is in progress") before asyncpg notices the
        socket is closed: a closed connection means start over, whatever the
        error says. None: an error of another kind, raised as it is."""
        if not (isinstance(exc, Fenced) or is_connection_error(exc)
                or any(c.is_closed() for c in self._connections)):
            return None
        reason = one_line(exc)
        if is_timeout(exc):
            # The server stopped answering (frozen, or cut off without a
            # word): a polite goodbye would wait for it.
            for conn in self._connections:
                conn.terminate()
            if reason == "TimeoutError":
                reason = "the database did not answer in time (TimeoutError)"
        return _LifeOver(reason)

    async def _announce(self, url: str) -> tuple[asyncpg.Connection, str]:
        """Connect and take a liveness lock on a fresh random id; the
        connection, and the URL of the server it reached."""
        for _ in range(10):
            self.worker_id = secrets.randbelow(2**31 - 2) + 1
            self.state = "standby"
            # Named after its id only once the lock is held: `reap` ends the
            # connections of ids nobody holds.
            conn, server = await db.connect_server(
                url, application_name=f"jobqueue worker - {self.name}"[:63])
            if await queries["lock_worker"].fetchval(
                conn, lock_class=WORKER_LOCK_CLASS, worker_id=self.worker_id
            ):
                await queries["rename_connection"].fetch(conn, name=self._app_name(self.role))
                host, port = db.servers(server)[0]
                where = f"{host}:{port}" if port else str(host or "the default server")
                logger.info("worker %d (%s) connected to %s", self.worker_id, self.name, where,
                            extra={"event": "worker_connected", "worker_id": self.worker_id,
                                   "worker_name": self.name, "server": where})
                return conn, server
            await conn.close()
        raise RuntimeError("could not find a free worker id")  # 2**31 ids: never in practice

    async def _await_schema(self, control: asyncpg.Connection) -> bool:
        """Wait until the schema is at least the one this code runs on (a
        rolling deploy whose new workers start before `jobqueue migrate` has
        finished), saying so once. False if stopped first. A newer schema is
        fine: revisions only add, so the previous release's workers keep
        running beside the new one's during a deploy."""
        said = False
        while not self.stopping:
            found = await queries["schema_revision"].fetchval(control)
            if found is not None and found >= REVISION:
                if said:
                    logger.info("schema at %s: worker %d starting", found, self.worker_id,
                                extra={"event": "schema_ready", "revision": found})
                return True
            if not said:
                logger.warning(
                    "the database's schema is at revision %s and this jobqueue needs %s: "
                    "waiting for `jobqueue migrate`", found, REVISION,
                    extra={"event": "schema_behind", "revision": found, "needed": REVISION})
                said = True
            await self.sleep_unless_stopping(SCHEMA_POLL)
        return False

    async def _contest(self, control: asyncpg.Connection, guards: Sequence[asyncio.Future[Any]]
                       ) -> bool:
        """Wait for the active lock (exclusive mode). False if stopped first.

        The wait happens inside PostgreSQL (`pg_advisory_lock`), so the lock is
        granted the moment its holder's connection ends. `guards` end the wait
        early: an upkeep loop failing, or this connection being lost."""
        if self.config.shared:
            return True
        if await queries["try_lock"].fetchval(control, lock_class=LOCK_CLASS, key=ACTIVE_KEY):
            return True
        logger.info("worker %d standing by (another worker is active); it runs %s",
                    self.worker_id, self._serving(),
                    extra={"event": "worker_standby", "worker_id": self.worker_id,
                           **self._serving_fields()})
        waiting = asyncio.ensure_future(
            queries["lock_active"].fetch(control, lock_class=LOCK_CLASS, key=ACTIVE_KEY))
        stopping = asyncio.ensure_future(self._stop_requested.wait())
        try:
            await asyncio.wait({waiting, stopping, *guards}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if waiting.done():
            waiting.result()
            return True
        # Stopped or lost while standing by: dropping the connection ends the wait.
        control.terminate()
        with contextlib.suppress(BaseException):
            await waiting
        if not self.stopping:
            _raise_from(guards)
        return False

    async def _activate(self, control: asyncpg.Connection) -> None:
        self.state = "active"
        self.was_active = True
        shared = self.config.shared
        await queries["rename_connection"].fetch(
            control, name=self._app_name("shared" if shared else "active"))
        await control.add_listener(CHANNEL, self._on_notify)
        logger.info("worker %d is %s; it runs %s", self.worker_id,
                    "working (shared mode)" if shared else "active", self._serving(),
                    extra={"event": "worker_active", "worker_id": self.worker_id,
                           "mode": "shared" if shared else "exclusive",
                           **self._serving_fields()})
        self.stats.start_clock()
        self._active.set()
        async with self.monitor_lock:
            assert self._monitor is not None
            rescued = await rescue(self._monitor, self.config.retry_policy)
        if rescued:
            self.stats.rescued += rescued
            logger.warning("returned %d job(s) of dead workers to the queue", rescued,
                           extra={"event": "jobs_rescued", "worker_id": self.worker_id,
                                  "jobs": rescued})

    async def _work(self, engine: AsyncEngine, guards: Sequence[asyncio.Future[Any]],
                    sync_types: list[str], sync_engine: SyncEngine | None) -> None:
        """Run the lanes until they finish (burst), a stop, or a guard trips.
        The lanes take the async job types; the sync ones (plain `def`
        handlers) have a lane of their own that runs them in threads."""
        async_types = [t for t in self.job_types if t not in sync_types]
        self.floors = Floors(self.job_types)  # a new life claims from the front
        self.released = Released()
        async with self.monitor_lock:  # what waits, before the lanes' first claims
            assert self._monitor is not None
            await self.book.look(self._monitor, self.floors)
        life = Life(worker_id=self.worker_id, registry=self.registry, stats=self.stats,
                    isolated_types=self.isolated_types, bell=self.bell,
                    stop=self._stop_requested, abandon=self._abandon, hand_back=self.hand_back,
                    pass_on=self.pass_on, released=self.released,
                    cancel_statement=self.cancel_statement, record_batch=self.record_batch,
                    alone=self.alone, book=self.book, floors=self.floors,
                    job_types=async_types)
        config = self.config
        lanes = [Lane(config, life, engine, n, AsyncExecutor(config, life, n), serves)
                 for n, serves in enumerate(config.lane_queues)
                 if async_types or not sync_types]
        if sync_engine is not None:
            sync = dataclasses.replace(life, job_types=sync_types)
            lanes.append(Lane(config, sync, engine, len(lanes),
                              ThreadExecutor(config, sync, self.threads, sync_engine),
                              serves=config.served))
        self._lanes = lanes
        tasks = [asyncio.create_task(lane.run()) for lane in lanes]
        all_lanes: asyncio.Future[list[None]] = asyncio.gather(*tasks)
        summaries = asyncio.create_task(self._log_summaries())
        try:
            await _first(all_lanes, self._stop_requested.wait(), *guards)
            if not all_lanes.done() and any(g.done() for g in guards):
                await self._cut_lanes(lanes, tasks, hand_back=False)
                _raise_from(guards)
            if not all_lanes.done():
                self.state = "stopping"
                await _first(all_lanes, self._abandon.wait(), timeout=self.config.grace_period)
                if not all_lanes.done():
                    await self._cut_lanes(lanes, tasks, hand_back=True)
            if self.aborting:
                await asyncio.gather(*tasks, return_exceptions=True)
            else:
                await all_lanes  # re-raises a lane's unexpected error
        finally:
            self._lanes = []
            for task in (*tasks, summaries):
                task.cancel()
            await asyncio.gather(*tasks, summaries, return_exceptions=True)
            if all_lanes.done() and not all_lanes.cancelled():
                all_lanes.exception()  # retrieved: errors of lanes cut off on purpose

    async def _cut_lanes(self, lanes: list[Lane], tasks: list[asyncio.Task[None]], *,
                         hand_back: bool) -> None:
        """Abandon running handlers: their connections are cut so their
        transactions roll back (nothing half-done commits). Handed back, the
        jobs that were cancelled meanwhile have their cancels sent again."""
        self._abandon.set()
        cancelled = set().union(*(lane.cancels_held() for lane in lanes))
        logger.warning("abandoning %d running lane(s); their jobs go back to the queue",
                       sum(not t.done() for t in tasks),
                       extra={"event": "lanes_abandoned", "worker_id": self.worker_id,
                              "lanes": sum(not t.done() for t in tasks)})
        for lane in lanes:
            lane.cut()
        if hand_back:  # make sure the server has let go before taking the jobs back
            async with self.monitor_lock:
                assert self._monitor is not None
                await queries["terminate_lanes"].fetch(self._monitor, id=self.worker_id)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if hand_back:
            await self.hand_back(None)
            await self.pass_on(sorted(cancelled))

    async def hand_back(self, ids: list[uuid.UUID] | None) -> int:
        """Return jobs this worker claimed but will not finish (None: all of them)."""
        async with self.monitor_lock:
            assert self._monitor is not None
            row = await queries["hand_back"].fetchrow(
                self._monitor, worker_id=self.worker_id, ids=ids)
        n = int(row["n"]) if row else 0
        self.stats.handed_back += n
        if n:
            logger.info("handed back %d job(s) that did not run", n,
                        extra={"event": "jobs_handed_back", "worker_id": self.worker_id,
                               "jobs": n})
        return n

    async def pass_on(self, ids: list[uuid.UUID]) -> None:
        """Send again the cancels this worker heard for jobs it let go still
        waiting (a batch that stopped early, a retry, a rollback, a stop):
        each is cancelled where it waits, or asked of the worker that took
        it since (`queries.sql: cancel`). So a cancel the worker was asked
        to carry out does not leave with it."""
        if not ids:
            return
        self.released.discard(ids)  # its own notification comes back: not again
        async with self.monitor_lock:
            if self._monitor is None:  # this life is over: its next one heard nothing
                logger.warning("the cancels of %d job(s) let go were not sent again: the "
                               "worker is starting over", len(ids),
                               extra={"event": "cancel_not_passed_on",
                                      "worker_id": self.worker_id,
                                      "job_ids": [str(i) for i in ids]})
                return
            for job_id in ids:
                await queries["cancel"].fetch(self._monitor, id=job_id,
                                              error_message=CANCELLED)
        logger.info("sent again the cancel of %d job(s) let go unfinished: %s", len(ids),
                    ", ".join(map(str, ids)),
                    extra={"event": "cancels_passed_on", "worker_id": self.worker_id,
                           "job_ids": [str(i) for i in ids]})

    async def record_batch(self, lane: int, xid: int, ids: list[uuid.UUID]) -> None:
        """Write down a quick batch before it runs (`queries.sql: record_batch`)."""
        async with self._ledger_lock:
            assert self._ledger is not None
            self._ledger_rows[lane] = await queries["record_batch"].fetchval(
                self._ledger, worker_id=self.worker_id, lane=lane, xid=xid, ids=ids,
                previous=self._ledger_rows.get(lane))

    async def cancel_statement(self, pid: int) -> None:
        """Stop the statement a lane's backend runs (a handler being stopped)."""
        async with self.monitor_lock:
            if self._monitor is not None:
                await queries["cancel_statement"].fetch(self._monitor, pid=pid)

    def cancel(self, job_id: uuid.UUID) -> bool:
        """Cancel job `job_id` if this worker holds it (True): its handler is
        stopped if it runs, the job fails `cancelled` (`cancels.py`). A job
        it let go waiting an instant ago was held when the cancel was sent:
        the cancel is sent again."""
        if self.released.take(job_id):
            sending = asyncio.ensure_future(self._send_again(job_id))
            self._sending.add(sending)
            sending.add_done_callback(self._sending.discard)
            return True
        return any(lane.interrupt(job_id, CANCELLED) for lane in self._lanes)

    async def _send_again(self, job_id: uuid.UUID) -> None:
        try:
            await self.pass_on([job_id])
        except Exception as exc:  # the life is ending: its next one hears nothing of it
            logger.warning("the cancel of job %s was not sent again (%s)", job_id,
                           one_line(exc), extra={"event": "cancel_not_passed_on",
                                                 "job_id": str(job_id),
                                                 "worker_id": self.worker_id})

    async def _log_summaries(self) -> None:
        """Every `summary_interval`, one INFO line of what the worker did since
        the last one (nothing when it did nothing). Its rate counts finished
        jobs (completed, or failed for good), as the final report's does."""
        interval = self.config.summary_interval
        if not interval:
            return
        mark = self.stats.mark()
        while True:
            await asyncio.sleep(interval)
            summary, mark = self.stats.since(mark)
            if not summary["completed"] + summary["failed"] + summary["retried"]:
                continue
            rerun = f", {summary['rerun']:,} rerun" if summary["rerun"] else ""
            latency = ("; enqueue to completion p50 {}, p95 {}, p99 {} ms".format(
                *(_shown_ms(summary[f"latency_{p}_ms"]) for p in ("p50", "p95", "p99")))
                if summary["completed"] else "")
            logger.info(
                "worker %d: %s jobs/s over %.1f s: %s completed, %s retried, %s failed%s%s",
                self.worker_id, f"{summary['jobs_per_sec']:,.1f}", summary["interval_s"],
                f"{summary['completed']:,}", f"{summary['retried']:,}",
                f"{summary['failed']:,}", rerun, latency,
                extra={"event": "worker_summary", "worker_id": self.worker_id, **summary})

    async def sleep_unless_stopping(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop_requested.wait(), seconds)

    def _finish(self) -> dict[str, Any]:
        self.stats.stop_clock()
        self.state = "stopped"
        report = {"status": "stopped", "worker_id": self.worker_id,
                  "was_active": self.was_active, **self.stats.report()}
        logger.info("worker %d stopped: %s", self.worker_id, json.dumps(report),
                    extra={"event": "worker_stopped", "worker_id": self.worker_id,
                           "report": report})
        return report

    async def _close_monitor(self, monitor: asyncpg.Connection) -> None:
        self._monitor = None
        await _close(monitor, lambda: queries["unregister_worker"].fetch(monitor,
                                                                       id=self.worker_id))

    async def _close_control(self, control: asyncpg.Connection) -> None:
        """Let go of the locks by closing the connection that holds them."""
        await _close(control, lambda: queries["unlock_all"].fetch(control))

    # -- small things ---------------------------------------------------------

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        if payload.startswith(CANCEL_PREFIX):
            with contextlib.suppress(ValueError):
                if self.cancel(uuid.UUID(payload[len(CANCEL_PREFIX):])):
                    logger.info("cancelling job %s", payload[len(CANCEL_PREFIX):],
                                extra={"event": "job_cancelling", "worker_id": self.worker_id,
                                       "job_id": payload[len(CANCEL_PREFIX):]})
            return
        if payload == SETTINGS_CHANGED:
            self.book.settings_changed()
        elif payload == ALONE:
            self.alone.want()
        elif (where := self.floors.heard(payload)) is not None:  # where new jobs wait
            self.book.heard(*where)
            self.bell.ring(where[0])  # one idle lane of each kind that serves the queue
            return
        self.bell.ring()

    def _serving(self) -> str:
        """What this worker runs, for the line that says its role: its job
        types (the sync ones marked) and queues."""
        types = [f"{t} (sync)" if self.registry.is_sync(t) else t for t in self.job_types]
        shown = ", ".join(types[:_TYPES_SHOWN])
        if len(types) > _TYPES_SHOWN:
            shown += f" and {len(types) - _TYPES_SHOWN} more"
        served = self.config.served
        queues = "every queue" if served is None else (
            f"queue{'s' if len(served) > 1 else ''} {', '.join(served)}")
        return f"{len(types)} job type{'s' if len(types) != 1 else ''} ({shown}) from {queues}"

    def _serving_fields(self) -> dict[str, Any]:
        served = self.config.served
        return {"job_types": list(self.job_types),
                "queues": None if served is None else list(served)}

    def _app_name(self, role: str) -> str:
        return f"jobqueue worker {self.worker_id} {role} {self.name}"[:63]

    def _install_signals(self) -> Callable[[], None]:
        if not self.install_signal_handlers:
            return lambda: None
        loop = asyncio.get_running_loop()
        installed = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.stop)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass  # not the main thread, or not a Unix loop

        def restore() -> None:
            for sig in installed:
                loop.remove_signal_handler(sig)

        return restore


async def _first(*waitables: Awaitable[Any], timeout: float | None = None) -> None:
    """Wait until the first of `waitables` finishes (or the timeout); coroutines
    among them are wrapped and cancelled afterwards, futures are left alone."""
    owned = [asyncio.ensure_future(w) for w in waitables if asyncio.iscoroutine(w)]
    futures = {w for w in waitables if not asyncio.iscoroutine(w)} | set(owned)
    try:
        await asyncio.wait(futures, timeout=timeout,  # type: ignore[type-var]
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        for f in owned:
            f.cancel()


def _raise_from(guards: Sequence[asyncio.Future[Any]]) -> None:
    """Re-raise why a guard tripped: the upkeep loop's error, or a lost connection."""
    for guard in guards:
        if guard.done() and not guard.cancelled() and guard.exception() is not None:
            raise guard.exception()  # type: ignore[misc]
    if any(g.done() for g in guards):
        raise ConnectionError("the control connection was lost")


#: Job types named in the line that says a worker's role (the rest are counted).
_TYPES_SHOWN = 10

#: Seconds between two looks at the schema's revision while it is behind.
SCHEMA_POLL = 1.0

#: Seconds a connection of a life that ends gets to say goodbye and close.
CLOSE_TIMEOUT = 5.0


async def _close(conn: asyncpg.Connection,
                 goodbye: Callable[[], Awaitable[Any]] | None = None) -> None:
    """Close a connection of this life, after its last statement (`goodbye`)
    if it is still open; a connection that cannot close politely (within
    CLOSE_TIMEOUT: its server may never answer) is cut."""
    if conn.is_closed():
        return
    try:
        if goodbye is not None:
            await asyncio.wait_for(goodbye(), CLOSE_TIMEOUT)
        await conn.close(timeout=CLOSE_TIMEOUT)
    except Exception:
        conn.terminate()


async def _cancel(task: asyncio.Future[Any]) -> None:
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


def _shown_ms(ms: float | None) -> str:
    """Three significant figures or so, for a person reading the line (the
    JSON event keeps the full value)."""
    if ms is None:
        return "?"
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}"
