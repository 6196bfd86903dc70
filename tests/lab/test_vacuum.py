"""jobqueue.lab.vacuum: what lesson 08 shows, at a small size, on the real
server: a held xid keeps every dead version, the claim from the front steps
over them all and the claim from a floor does not, and a job enqueued by a
transaction that began before the floor moved is behind it until the floor
goes back to where its insert said it waits."""

from __future__ import annotations

import asyncpg
import matplotlib
import pytest

from jobqueue.lab import vacuum
from jobqueue.ops import horizon
from jobqueue.schema.queries import queries
from jobqueue.worker.floors import NIL
from tests.lab.conftest import Labelled

matplotlib.use("Agg")

DEAD = 3000  # about 60 heap and index pages of dead versions: plain to see, quick to make
WAITING = 20


async def held_flow(labelled: Labelled) -> tuple[dict[str, asyncpg.Connection], vacuum.Flow, int]:
    conns = await labelled("holder", "worker")
    # autovacuum, on its own schedule, would re-estimate n_dead_tup (ANALYZE)
    await conns["worker"].execute("ALTER TABLE jobs SET (autovacuum_enabled = off)")
    await conns["holder"].execute("BEGIN")
    xid = await conns["holder"].fetchval("SELECT pg_current_xact_id()")
    return conns, await vacuum.Flow.open(conns["worker"], batch=500), xid


def test_the_lessons_claim_is_the_workers_take() -> None:
    """The lesson measures the statement a lane sends, from the front (no
    floor) and from a floor, not a copy of it."""
    assert vacuum.TAKE is queries["take"]
    assert set(vacuum.claim_values(None, 10)) == set(vacuum.TAKE.params)
    assert vacuum.claim_values(None, 10)["floors"] == [None]


@pytest.mark.serial  # a transaction of any test beside it holds the horizon too
async def test_a_held_xid_keeps_every_dead_version_until_it_ends(labelled: Labelled) -> None:
    conns, flow, xid = await held_flow(labelled)
    worker = conns["worker"]
    holder = await horizon.oldest(worker)
    assert holder is not None and holder.name == "lab holder"
    assert holder.pid == conns["holder"].get_server_pid()

    table = await vacuum.pile_up(flow, [0, DEAD], waiting=WAITING)
    assert list(table["dead versions"]) == [0, DEAD]  # one per completed job, counted at once
    assert list(table["taken"]) == [WAITING, WAITING]
    assert table["scan buffers"][1] > table["scan buffers"][0] + DEAD // 100
    line = await vacuum.status_vacuum_line(worker)
    assert "'lab holder'" in line and f"{DEAD + WAITING:,} dead row versions" in line

    held = await vacuum.vacuum(worker)
    assert (held.removed, held.not_removable) == (0, DEAD + WAITING)
    # At the holder's xid, or below it when a transaction of a test running
    # beside this one (another database: its xid still counts) began first.
    assert held.cutoff <= xid % 2**32

    await flow.add(WAITING)
    twice = [await vacuum.claim_cost(worker) for _ in range(2)]
    assert twice[0].plan.endswith(tuple(f"Index Scan ({i})" for i in vacuum.CLAIM_INDEXES))
    assert twice[1].scan_buffers == twice[0].scan_buffers  # nothing marked dead while held

    await conns["holder"].execute("ROLLBACK")
    assert await horizon.oldest(worker) is None
    released = [await vacuum.claim_cost(worker) for _ in range(2)]
    assert 3 * released[1].scan_buffers < released[0].scan_buffers  # the first one marked them

    cleaned = await vacuum.vacuum(worker)
    assert (cleaned.not_removable, cleaned.dead_items) == (0, DEAD + WAITING)
    assert cleaned.index_pages_deleted > 0
    after = await vacuum.claim_cost(worker)
    assert after.taken == WAITING
    assert after.scan_buffers <= table["scan buffers"][0] + 5


async def test_a_floored_claim_reads_few_buffers_and_a_late_job_is_announced_behind_it(
    labelled: Labelled,
) -> None:
    conns, flow, _ = await held_flow(labelled)
    worker = conns["worker"]
    table = await vacuum.pile_up(flow, [0, DEAD], waiting=WAITING, floored=True)
    assert list(table["floored taken"]) == list(table["taken"]) == [WAITING, WAITING]
    assert table["buffers"][1] > table["buffers"][0] + DEAD // 100
    assert abs(table["floored buffers"][1] - table["floored buffers"][0]) <= 5
    assert flow.completed == flow.added == DEAD + WAITING
    assert flow.floor is not None  # none waiting: the last claim's now()
    assert flow.floor[0] > await worker.fetchval("SELECT max(run_at) FROM jobs")
    assert len(vacuum.plot_buffers(table, table).axes[0].lines) == 3

    late = (await labelled("late"))["late"]
    await late.execute("BEGIN")
    await vacuum.enqueue(late)  # due at its transaction's start
    await vacuum.enqueue(worker)  # due later, committed at once
    assert await flow.run(floored=True) == 1
    await late.execute("COMMIT")

    assert (await vacuum.claim_cost(worker, floored=True, floor=flow.floor)).taken == 0
    assert (await vacuum.claim_cost(worker)).taken == 1
    assert (await vacuum.claim_cost(worker, floored=True, floor=None)).taken == 1  # no floor
    # What the insert announced at its commit is where the floor goes back to.
    late_at = await worker.fetchval("SELECT min(run_at) FROM jobs WHERE status = 'pending'")
    assert late_at < flow.floor[0]
    assert (await vacuum.claim_cost(worker, floored=True, floor=(late_at, NIL))).taken == 1
