"""Bulk operations by filter: the audit record and progress of each."""

from __future__ import annotations

from django.conf import settings as dj_settings
from django.db import models
from django.db.models import Q


class BulkOperation(models.Model):
    """One action on every run a filter matches (``queuety.bulk()``): its audit record and
    its progress, processed in chunks by id (``queuety.bulk_actions``).

    The matching set is bounded at the start (``max_run_id``: a run dispatched later is not
    acted on) and walked in ascending id order; ``cursor`` is the last run id dealt with, and
    it moves in the same transaction as that run's change, so a processor that dies resumes
    after the last run it changed and never acts on a run twice. ``lease_token`` and
    ``heartbeat_at`` are the processing worker's lease (``QUEUETY["BULK_LEASE"]``).
    """

    PENDING, RUNNING, DONE, CANCELLED, FAILED = "pending", "running", "done", "cancelled", \
        "failed"
    STATUSES = [(s, s) for s in (PENDING, RUNNING, DONE, CANCELLED, FAILED)]
    ACTIONS = [(a, a) for a in ("cancel", "pause", "resume", "retry", "rewind", "migrate")]

    action = models.CharField(max_length=16, choices=ACTIONS)
    arguments = models.JSONField(default=dict, blank=True,
                                 help_text="The action's arguments (rewind's step, migrate's "
                                           "to, step_map and state).")
    filter = models.JSONField(default=dict, blank=True,
                              help_text="The runs list's filter keys, as given.")
    dry_run = models.BooleanField(default=False)
    # Who asked: the user whose RUN_SCOPE narrows every chunk (None with for_user False: an
    # operator's process with full access), and how timelines name them.
    requested_by = models.ForeignKey(dj_settings.AUTH_USER_MODEL, null=True, blank=True,
                                     on_delete=models.SET_NULL, related_name="+")
    for_user = models.BooleanField(default=False)
    actor = models.CharField(max_length=255, blank=True, default="")
    status = models.CharField(max_length=16, choices=STATUSES, default=PENDING)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    max_run_id = models.BigIntegerField(default=0)
    cursor = models.BigIntegerField(default=0)
    matched = models.IntegerField(default=0, help_text="Runs the filter matched at the start.")
    acted = models.IntegerField(default=0)
    skipped = models.IntegerField(default=0)
    skipped_reasons = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True, default="")
    lease_token = models.CharField(max_length=64, blank=True, default="")
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    stalls = models.IntegerField(default=0, db_default=0,
                                 help_text="Leases taken over since the cursor last moved.")

    class Meta:
        indexes = [models.Index(fields=["status"], name="queuety_bulk_live",
                                condition=Q(status__in=["pending", "running"]))]

    def __str__(self) -> str:
        return f"bulk {self.action} #{self.pk} ({self.status})"

