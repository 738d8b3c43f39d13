"""The sweeper's phase for bulk operations (``queuety.bulk_actions``): send the task again for
every live operation whose worker's lease lapsed, or whose first message looks lost."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Q

from queuety import publish
from queuety.conf import settings
from queuety.models import BulkOperation


def recover(now: datetime) -> int:
    """Publish ``queuety.bulk_operation`` for each pending or running operation that nobody
    renewed for ``QUEUETY["BULK_LEASE"]`` seconds; return how many. The task that gets it
    takes the lapsed lease over and resumes after the operation's cursor."""
    lapsed = now - timedelta(seconds=settings.BULK_LEASE)
    ids = list(BulkOperation.objects.filter(
        Q(heartbeat_at__lt=lapsed) | Q(heartbeat_at__isnull=True, created_at__lt=lapsed),
        status__in=(BulkOperation.PENDING, BulkOperation.RUNNING), dry_run=False,
    ).values_list("pk", flat=True))
    for op_id in ids:
        publish.bulk_operation(op_id)
    return len(ids)
