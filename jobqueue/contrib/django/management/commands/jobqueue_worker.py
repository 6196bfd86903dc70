"""`python manage.py jobqueue_worker [worker options]`: `jobqueue worker` with
this project's settings, its tasks registered and its database."""

from typing import Any

from django.core.management.base import BaseCommand

from jobqueue.contrib.django import worker


class Command(BaseCommand):
    help = ("Run a jobqueue worker for this project's tasks; takes `jobqueue worker`'s "
            "options (--queues, --concurrency, --burst, ...: `jobqueue worker --help`).")

    def run_from_argv(self, argv: list[str]) -> None:
        # Every option is the worker's: Django's parser would refuse them.
        worker.run_cli(["worker", *argv[2:]])

    def handle(self, *args: Any, **options: Any) -> None:  # pragma: no cover - call_command
        worker.run_cli(["worker", *args])
