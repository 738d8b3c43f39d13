"""Demo Django project for Queuety. Importing it loads the Celery app, as Celery's guide advises."""

from project.celery import app as celery_app

__all__ = ["celery_app"]
