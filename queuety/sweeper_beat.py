"""The sweeper's django-celery-beat schedule, kept in step with ``QUEUETY["SWEEP_INTERVAL"]``."""

from __future__ import annotations

from queuety.conf import settings

SWEEPER_TASK_NAME = "queuety: sweep due and lost steps"


def ensure_sweeper_schedule(using: str = "default") -> None:
    """Make sure beat runs ``queuety.sweep`` every ``SWEEP_INTERVAL`` seconds (idempotent)."""
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    interval, _ = IntervalSchedule.objects.using(using).get_or_create(
        every=settings.SWEEP_INTERVAL, period=IntervalSchedule.SECONDS
    )
    PeriodicTask.objects.using(using).update_or_create(
        name=SWEEPER_TASK_NAME,
        defaults={"task": "queuety.sweep", "interval": interval, "enabled": True,
                  "queue": settings.QUEUE},
    )
