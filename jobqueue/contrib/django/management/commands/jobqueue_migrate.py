"""`python manage.py jobqueue_migrate`: create or upgrade jobqueue's tables
in this project's database (`jobqueue migrate` with its URL)."""

from typing import Any

from django.core.management.base import BaseCommand

from jobqueue.contrib.django import worker


class Command(BaseCommand):
    help = "Create or upgrade jobqueue's tables in this project's database."

    def run_from_argv(self, argv: list[str]) -> None:
        worker.run_cli(["migrate", *argv[2:]])

    def handle(self, *args: Any, **options: Any) -> None:  # pragma: no cover - call_command
        worker.run_cli(["migrate", *args])
