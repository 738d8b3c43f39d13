"""Django app configuration."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_delete, post_migrate, post_save, pre_delete
from django.utils.module_loading import autodiscover_modules


class QueuetyConfig(AppConfig):
    """Queuety: durable workflows run by Celery workers."""

    name = "queuety"
    verbose_name = "Queuety workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Importing checks registers the system checks (queuety.E001 ...).
        from queuety import checks, conf  # noqa: F401
        from queuety.core import imports

        # Stored handler paths resolve through QUEUETY["HANDLER_ALIASES"]: the core reads them
        # from conf (on first use, and again when the setting changes), and imports no Django.
        # Before autodiscovery, so a workflows.py calling queuety.alias() sees them.
        imports.use_alias_source(conf.handler_aliases)

        # Each installed app's workflows.py registers its workflows (queuety.register), as
        # Django's admin imports every admin.py.
        autodiscover_modules("workflows")

        post_migrate.connect(_schedule_sweeper, sender=self)
        # The sweeper's purge phase archives through the export, which sits above the runtime.
        from queuety import retention
        from queuety.runtime import sweeper

        sweeper.use_purger(retention.sweep_phase)
        # A schedule's fire is keyed by the moment beat sent it (queuety.schedules).
        from celery.signals import before_task_publish

        from queuety import schedules

        before_task_publish.connect(schedules.stamp_sent_at, weak=False,
                                    dispatch_uid="queuety.stamp_sent_at")
        # Webhook endpoints receive events through the outbox, a sink of queuety.signals.
        from queuety import signals
        from queuety.models import WebhookEndpoint
        from queuety.webhooks import outbox

        signals.add_sink(outbox.wants, outbox.write)
        # A chain's catch task is enqueued in the transaction that fails the chain's run.
        from queuety.jobs import callbacks

        signals.add_sink(callbacks.wants, callbacks.write)
        post_save.connect(outbox.forget, sender=WebhookEndpoint)
        post_delete.connect(outbox.forget, sender=WebhookEndpoint)
        pre_delete.connect(outbox.hold_for_delete, sender=WebhookEndpoint,
                           dispatch_uid="queuety.webhooks.hold_for_delete")


def _schedule_sweeper(using: str = "default", **kwargs: Any) -> None:
    """Create or update the django-celery-beat entry that runs the sweeper."""
    # Imported when called: queuety.sweeper_beat imports django-celery-beat's models, which cannot
    # be imported while the app registry is still loading this module.
    from queuety.sweeper_beat import ensure_sweeper_schedule

    ensure_sweeper_schedule(using=using)
