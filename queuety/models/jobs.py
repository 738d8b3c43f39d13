"""Jobs: Django's tasks as one-step runs."""

from __future__ import annotations

from typing import ClassVar

from django.db import models

from queuety.models.runs import WorkflowRun

#: What a job's workflow name starts with (``queuety.jobs.specs.PREFIX``, which sits above the
#: models; a unit test keeps them equal).
JOB_PREFIX = "task:"
#: What a unique job's dispatch key starts with (``queuety.jobs.unique``); here, below the
#: tasks framework, so that retention reads it on a site without that framework.
UNIQUE_KEY_PREFIX = "job:"


class JobManager(models.Manager["Job"]):
    """Only the runs that are jobs (their workflow is a task's, ``task:<module path>``)."""

    def get_queryset(self) -> models.QuerySet[Job]:
        # A prefix match, which the name index's varchar_pattern_ops twin serves.
        return super().get_queryset().filter(name__startswith=JOB_PREFIX)


class Job(WorkflowRun):
    """A job: a run of a task's one-step workflow (``queuety.jobs``), for the admin's Jobs
    list. A proxy: no table of its own, the same rows as :class:`WorkflowRun`."""

    objects: ClassVar[JobManager] = JobManager()

    class Meta:
        proxy = True
        verbose_name = "job"
        verbose_name_plural = "jobs"
        # A job is a run: the runs' permissions (view, change) govern it, not its own.
        default_permissions = ()

    def __str__(self) -> str:
        return f"job #{self.pk} ({self.name.removeprefix(JOB_PREFIX)})"

