"""jobqueue as the backend of Django's task framework (`django.tasks`,
Django 6.0 and later).

    # settings.py
    INSTALLED_APPS = [..., "jobqueue.contrib.django"]      # manage.py jobqueue_worker
    TASKS = {"default": {"BACKEND": "jobqueue.contrib.django.JobqueueBackend"}}

`@task`-decorated functions then `.enqueue()` into the `jobs` table through
Django's own database connection, inside the caller's `transaction.atomic()`
if there is one, and `python manage.py jobqueue_worker` (or `jobqueue worker
--django SETTINGS`) runs them. `backend.py` says how Django's notions map
onto jobqueue's, `worker.py` how the worker finds the tasks, and what is
atomic with what.
"""

from jobqueue.contrib.django.backend import JobqueueBackend

__all__ = ["JobqueueBackend"]
