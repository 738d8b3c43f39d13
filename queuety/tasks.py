"""Celery tasks: thin wrappers over ``queuety.services``. Names are stable message contracts."""

from __future__ import annotations

from celery import shared_task

from queuety import services


@shared_task(name="queuety.execute_step", acks_late=True, reject_on_worker_lost=True,
             ignore_result=True)
def execute_step(step_run_id: int) -> None:
    """Run one attempt of step row ``step_run_id``; duplicates are dropped by the claim."""
    services.execute_step(step_run_id)


@shared_task(name="queuety.sweep", ignore_result=True)
def sweep() -> dict[str, int]:
    """Recover lost attempts and re-publish due steps (scheduled by django-celery-beat)."""
    return services.sweep()
