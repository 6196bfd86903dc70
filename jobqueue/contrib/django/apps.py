"""The Django app: `manage.py jobqueue_worker` and `jobqueue_migrate`."""

from django.apps import AppConfig


class JobqueueConfig(AppConfig):
    name = "jobqueue.contrib.django"
    label = "jobqueue"
    verbose_name = "jobqueue"
