"""The workers the sweeper watches, and the sweeper's lease."""

from __future__ import annotations

from django.db import models


class Worker(models.Model):
    """A worker's main process, alive as long as it beats (every ``HEARTBEAT_INTERVAL``).

    When one stops beating (killed, out of memory, its machine lost), the sweeper takes back
    what it held: its pool processes' attempts, and the step messages it had reserved from the
    broker (a retry's back-off, a short delay), which a Redis broker would only hand out again
    an hour later. A worker that shuts down cleanly deletes its row.
    """

    name = models.CharField(max_length=255, unique=True,
                            help_text="host:pid of the main process.")
    processes = models.JSONField(default=list, help_text="host:pid of each pool process "
                                 "(the claimed_by of the step rows they run).")
    started_at = models.DateTimeField()
    beat_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"worker {self.name} (beat {self.beat_at:%H:%M:%S})"


class SweepLease(models.Model):
    """Which worker sweeps, or swept last, and since when (``queuety.store.sweeps``).

    Every worker's main process offers to sweep every ``SWEEP_INTERVAL``; the one that claims
    this row sweeps, so sweeps run one at a time and about once an interval however many
    workers there are. A sweeper that dies holding it loses it at ``expires_at``.
    """

    name = models.CharField(max_length=64, unique=True)
    token = models.BigIntegerField(default=0, help_text="Counts the sweeps: each claim adds "
                                   "one, and only the claim's own token renews or ends it.")
    holder = models.CharField(max_length=255, blank=True,
                              help_text="The worker (or the process) that claimed it last.")
    started_at = models.DateTimeField(null=True, help_text="When the last sweep started.")
    finished_at = models.DateTimeField(null=True, help_text="When it ended; empty while it "
                                       "runs, or if its sweeper died.")
    expires_at = models.DateTimeField(null=True, help_text="When another worker may take over "
                                      "a sweep that has not ended (SWEEP_LEASE after its last "
                                      "renewal).")

    def __str__(self) -> str:
        return f"sweep {self.token} by {self.holder or 'nobody'}"

