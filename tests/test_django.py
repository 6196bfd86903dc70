"""Django's task framework on jobqueue: a real Django 6 project
(tests/django_project) on this test's database, its commands run as a user
runs them, in the Python 3.12+ venv `make setup` builds for Django
(.venv-django)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import asyncpg
import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ROOT / "tests" / "django_project"
PYTHON = ROOT / ".venv-django" / "bin" / "python"
MISSING = ROOT / ".venv-django.missing"


@pytest.fixture
def django(db_url: str) -> object:
    """Runs `manage.py ...` of the test project on the test's database."""
    if MISSING.exists():  # `make setup` found no Python 3.12+, or could not install Django
        pytest.skip(MISSING.read_text().strip())
    if not PYTHON.exists():
        pytest.fail("no .venv-django: run `make setup` (it builds it when a Python 3.12+ "
                    "is found)")
    env = {**os.environ, "DATABASE_URL": db_url, "PYTHONPATH": str(PROJECT)}
    env.pop("DJANGO_SETTINGS_MODULE", None)

    def manage(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(PYTHON), "manage.py", *args], cwd=PROJECT, env=env,
                              capture_output=True, text=True, timeout=120)
        if check:
            assert done.returncode == 0, f"manage.py {args}: {done.stdout}{done.stderr}"
        return done

    manage("migrate", "--run-syncdb", "--verbosity", "0")
    manage.url = db_url  # type: ignore[attr-defined]
    return manage


def shell(manage: object, code: str) -> list[str]:
    """Lines a snippet prints, run by `manage.py shell` in the project."""
    return manage("shell", "--no-imports", "-c", code).stdout.splitlines()  # type: ignore[operator]


async def test_enqueue_joins_the_callers_transaction_and_the_worker_runs_the_task(
    django: object, conn: asyncpg.Connection
) -> None:
    [order_id, result_id] = shell(django, """
from django.db import transaction
from shop.models import Order
from shop.tasks import charge
with transaction.atomic():
    order = Order.objects.create(cents=1999)
    result = charge.enqueue(order.id)
print(order.id); print(result.id)
try:
    with transaction.atomic():
        charge.enqueue(12345)
        raise RuntimeError("rolled back")
except RuntimeError:
    pass
""")
    jobs = await conn.fetch("SELECT id, job_type, payload::text, queue, priority FROM jobs")
    assert [(str(j["id"]), j["job_type"], json.loads(j["payload"]), j["queue"], j["priority"])
            for j in jobs] == [(result_id, "shop.tasks.charge",
                                {"args": [int(order_id)], "kwargs": {}}, "default", 0)]
    assert shell(django, f"""
from shop.tasks import charge
print(charge.get_result("{result_id}").status)
""") == ["READY"]

    done = django("jobqueue_worker", "--burst")
    assert "Django tasks: shop.tasks.async_total, shop.tasks.charge" in done.stderr
    assert await conn.fetchval("SELECT paid FROM shop_order WHERE id = $1", int(order_id))
    assert shell(django, f"""
from shop.tasks import charge
result = charge.get_result("{result_id}")
print(result.status, result.return_value, result.attempts, result.finished_at is not None)
""") == ["SUCCESSFUL {'charged': 1999} 1 True"]


async def test_priorities_queues_run_after_and_context_map_onto_jobqueue(
    django: object, conn: asyncpg.Connection
) -> None:
    ids = shell(django, """
import datetime as dt
from django.utils import timezone
from shop.tasks import refund, which_attempt, async_total
later = timezone.now() + dt.timedelta(days=1)
print(refund.enqueue(7, reason="late").id)
print(refund.using(priority=-20, run_after=later).enqueue(8).id)
print(which_attempt.enqueue().id)
print(async_total.enqueue([1, 2, 3]).id)
""")
    rows = {str(r["id"]): r for r in await conn.fetch(
        "SELECT id, queue, priority, run_at > now() + interval '23 hours' AS later FROM jobs")}
    assert [(rows[i]["queue"], rows[i]["priority"], rows[i]["later"]) for i in ids] == [
        ("billing", 50, False), ("billing", -20, True), ("default", 0, False),
        ("default", 0, False)]

    out = shell(django, f"""
from django.tasks import default_task_backend as backend
for i in {ids!r}:
    r = backend.get_result(i)
    print(r.status, r.return_value if r.status == "SUCCESSFUL" else "-")
""")
    assert out == ["READY -", "READY -", "READY -", "READY -"]
    # the CLI's form of the worker, given the project's settings
    env = {**os.environ, "PYTHONPATH": str(PROJECT),
           "DATABASE_URL": django.url}  # type: ignore[attr-defined]
    done = subprocess.run([str(PYTHON.parent / "jobqueue"), "worker", "--django",
                           "shopsite.settings", "--burst", "--queues", "default,billing"],
                          cwd=PROJECT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = shell(django, f"""
from django.tasks import default_task_backend as backend
for i in {ids!r}:
    r = backend.get_result(i)
    print(r.status, r.return_value if r.status == "SUCCESSFUL" else "-")
""")
    assert out == ["SUCCESSFUL refunded 7: late", "READY -", "SUCCESSFUL 1", "SUCCESSFUL 6"]


async def test_what_a_failing_task_keeps_is_what_django_committed(
    django: object, conn: asyncpg.Connection
) -> None:
    """Django ORM writes are on Django's connection, not in the job's
    transaction: a task that fails keeps what it committed (autocommit), and
    loses what its own `transaction.atomic()` rolled back."""
    ids = shell(django, """
from shop.tasks import write_then_fail, write_atomically_then_fail
print(write_then_fail.enqueue("kept").id)
print(write_atomically_then_fail.enqueue("gone").id)
""")
    django("jobqueue_worker", "--burst")
    assert [r["text"] for r in await conn.fetch("SELECT text FROM shop_note")] == ["kept"]
    out = shell(django, f"""
from django.tasks import default_task_backend as backend
for i in {ids!r}:
    r = backend.get_result(i)
    e = r.errors[-1]
    print(r.status, r.attempts, e.exception_class_path, e.exception_class.__name__,
          e.traceback.strip().splitlines()[-1])
""")
    assert out == [
        "FAILED 1 shop.tasks.PaymentDeclined PaymentDeclined shop.tasks.PaymentDeclined: kept",
        "FAILED 1 shop.tasks.PaymentDeclined PaymentDeclined shop.tasks.PaymentDeclined: gone"]
    missing = shell(django, """
from django.tasks import default_task_backend as backend
from django.tasks.exceptions import TaskResultDoesNotExist
for i in ("not-an-id", "00000000-0000-0000-0000-000000000000"):
    try:
        backend.get_result(i)
    except TaskResultDoesNotExist:
        print("missing")
""")
    assert missing == ["missing", "missing"]


def test_the_database_url_comes_from_the_projects_settings(django: object, db_url: str) -> None:
    """What `jobqueue_worker` and `jobqueue_migrate` use when DATABASE_URL is
    not set: the database of DATABASES, socket directory included."""
    [url] = shell(django, """
from jobqueue.contrib.django.worker import database_url
print(database_url())
""")
    from sqlalchemy.engine import make_url
    made, given = make_url(url), make_url(db_url)
    assert (made.database, made.username, made.query.get("host")) == (
        given.database, given.username, given.query.get("host"))
    migrated = django("jobqueue_migrate")  # type: ignore[operator]
    assert migrated.returncode == 0
