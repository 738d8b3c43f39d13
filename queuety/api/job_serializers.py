"""Response shapes of the ``jobs/`` endpoints, for the OpenAPI schema."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

# As in queuety.api.serializers: each is Serializer[Any], a JSON shape read from plain dicts.


class TaskErrorSerializer(serializers.Serializer[Any]):
    """One failed attempt, as the framework's ``TaskError``."""

    exception_class_path = serializers.CharField()
    traceback = serializers.CharField()


class JobSerializer(serializers.Serializer[Any]):
    """A job: its ``TaskResult``'s fields, ``buried``, its run's own status and error, and
    links to itself and its run."""

    id = serializers.IntegerField(help_text="The job's id: its run's id (the TaskResult's id "
                                            "is this number as a string).")
    task = serializers.CharField(help_text="The task's module path.")
    backend = serializers.CharField(help_text="The TASKS alias it was enqueued on.")
    queue_name = serializers.CharField()
    priority = serializers.IntegerField()
    status = serializers.ChoiceField(choices=["READY", "RUNNING", "SUCCESSFUL", "FAILED"],
                                     help_text="The framework's TaskResultStatus.")
    buried = serializers.BooleanField(help_text="Failed for good (attempts exhausted, or "
                                                "buried by an operator) until retried.")
    run_status = serializers.CharField(help_text="The run's status (cancelled jobs are "
                                                 "FAILED and 'cancelled' here).")
    run_error = serializers.DictField(allow_null=True, help_text="Why the run failed, or who "
                                                                 "buried it.")
    args = serializers.ListField()
    kwargs = serializers.DictField()
    return_value = serializers.JSONField(required=False, help_text="Only once SUCCESSFUL.")
    errors = TaskErrorSerializer(many=True)  # type: ignore[assignment]
    worker_ids = serializers.ListField(child=serializers.CharField())
    attempts = serializers.IntegerField()
    enqueued_at = serializers.DateTimeField(allow_null=True)
    started_at = serializers.DateTimeField(allow_null=True)
    last_attempted_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    unreadable = serializers.CharField(required=False, help_text="Why the job cannot be read "
                                       "as a TaskResult (its task no longer imports).")
    url = serializers.URLField()
    run_url = serializers.URLField(help_text="The job's run: GET runs/<id>/.")


class JobPageSerializer(serializers.Serializer[Any]):
    """A page of ``GET jobs/``: follow ``next`` (a URL with a cursor) for older jobs."""

    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = JobSerializer(many=True)
