"""Resource control: concurrency groups, their starts and in-step leases, and paused queues."""

from __future__ import annotations

from django.db import models


class GroupStart(models.Model):
    """One start of a step in a concurrency group: the ledger rate limits count."""

    group = models.CharField(max_length=255)
    started_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["group", "started_at"], name="queuety_group_start")]

    def __str__(self) -> str:
        return f"{self.group} started at {self.started_at:%H:%M:%S.%f}"


class ResourceGroup(models.Model):
    """A concurrency group that has throttled a step: when its next wake-up is due (a rate
    limit's window reopening), so one timer is sent per group and period, not one per step;
    and when a queue's line last woke one of its steps (the groups sharing a queue's cost
    budget take turns by it)."""

    name = models.CharField(max_length=255, unique=True)
    wake_at = models.DateTimeField(null=True, blank=True)
    # When a step of the group was last woken from a queue's line: the groups sharing a
    # queue's cost budget take turns by it.
    served_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.name


class GroupLease(models.Model):
    """A slot of a concurrency group held from inside a running step (an agent's model
    request, ``queuety.store.leases``), beside the slots whole steps hold.

    It counts while the process that took it (``holder``) beats: a worker that died
    mid-request leaves a row whose ``beat_at`` ages past ``WORKER_LOST_AFTER``, which no longer
    counts (and is deleted by the next acquire).
    """

    group = models.CharField(max_length=255)
    step_run = models.ForeignKey("StepRun", on_delete=models.CASCADE, related_name="+",
                                 db_index=False)
    attempt = models.PositiveIntegerField()
    acquired_at = models.DateTimeField()
    holder = models.CharField(max_length=255, help_text="The claimed_by name of the process "
                              "holding it; its heartbeat refreshes beat_at.")
    beat_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["group", "acquired_at"], name="queuety_lease_group"),
                   models.Index(fields=["step_run"], name="queuety_lease_step")]

    def __str__(self) -> str:
        return f"{self.group} held by step row {self.step_run_id} (attempt {self.attempt})"


class QueuePause(models.Model):
    """A Celery queue an operator paused (``queuety.queues``): while its row exists, no step
    of the queue starts; a step that reaches a worker waits throttled (``queue paused``) until
    the queue is resumed. The claim tests this table in its own statement (no query of its
    own per step)."""

    queue = models.CharField(max_length=255, unique=True)
    paused_at = models.DateTimeField()
    paused_by = models.CharField(max_length=255, blank=True, default="", db_default="")
    reason = models.TextField(blank=True, default="", db_default="")

    class Meta:
        verbose_name = "queue"
        verbose_name_plural = "queues"

    def __str__(self) -> str:
        return self.queue

