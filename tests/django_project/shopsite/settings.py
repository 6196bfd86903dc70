"""A small Django 6 project on jobqueue's task backend; DATABASE_URL (a
postgresql:// URL, the test's database) says where."""

import os
from urllib.parse import parse_qs, unquote, urlsplit

url = urlsplit(os.environ["DATABASE_URL"])
query = parse_qs(url.query)
SECRET_KEY = "tests only"
USE_TZ = True
INSTALLED_APPS = ["jobqueue.contrib.django", "shop"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": url.path.lstrip("/"),
        "USER": unquote(url.username or ""),
        "PASSWORD": unquote(url.password or ""),
        "HOST": query.get("host", [url.hostname or ""])[0],
        "PORT": str(url.port or ""),
    }
}
TASKS = {
    "default": {
        "BACKEND": "jobqueue.contrib.django.JobqueueBackend",
        "QUEUES": ["default", "billing"],
        "OPTIONS": {"MAX_RETRIES": 0},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
