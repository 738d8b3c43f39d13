"""The Celery app: configured from Django settings (``CELERY_*``), tasks found in installed apps.

Run a worker with ``celery -A project worker`` (add ``-B`` in development for the sweeper).
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

app = Celery("project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
