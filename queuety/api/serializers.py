"""Response shapes, for the OpenAPI schema (validation of replies is the JSON Schema's job)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

# Each serializer below is Serializer[Any]: it describes a JSON shape read from plain dicts,
# or from a list of them with many=True, which the stubs type as the same instance
# parameter; there is no model instance to name.


class WaitDetailsSerializer(serializers.Serializer[Any]):
    """What the current wait is waiting for (keys without a value are left out)."""

    step_name = serializers.CharField()
    matched = serializers.ListField(child=serializers.CharField(), required=False)
    remaining = serializers.ListField(child=serializers.CharField(), required=False)
    wait_mode = serializers.CharField(required=False)
    human_wait = serializers.CharField(required=False)
    result_key = serializers.CharField(required=False)
    schema = serializers.DictField(required=False)
    expires_at = serializers.DateTimeField(
        required=False, help_text="When the wait's timeout settles it (waits with a timeout).")
    timeout_seconds = serializers.FloatField(required=False)
    on_timeout = serializers.CharField(
        required=False, help_text="'fail', 'continue' or the name of the step to jump to.")


class ProgressSerializer(serializers.Serializer[Any]):
    """What the running step last reported with ``context.heartbeat(progress=...)``."""

    step_name = serializers.CharField()
    branch = serializers.IntegerField(help_text="The branch or item, for a fan-out step.")
    # The metaclass pops declared fields off the class, so this does not hide Serializer.data;
    # the stubs cannot model that.
    data = serializers.DictField(  # type: ignore[assignment]
        help_text="The progress as the handler reported it.")
    text = serializers.CharField(help_text="In a few words, such as '450/1000 (45%)'.")
    reported_at = serializers.DateTimeField(allow_null=True)


class MachineTransitionSerializer(serializers.Serializer[Any]):
    """One transition of a state machine run."""

    to = serializers.CharField()
    event = serializers.CharField()
    at = serializers.CharField()

    def get_fields(self) -> dict[str, Any]:
        fields = super().get_fields()
        fields["from"] = serializers.CharField()  # a Python keyword, so named here
        return fields


class MachineStatusSerializer(serializers.Serializer[Any]):
    """The fields of ``queuety.machine_status()``."""

    run_id = serializers.IntegerField()
    machine = serializers.CharField()
    state = serializers.CharField()
    status = serializers.CharField()
    final = serializers.BooleanField()
    events = serializers.ListField(child=serializers.CharField())
    history = MachineTransitionSerializer(
        many=True, help_text="The newest transitions (at most 50), oldest first.")
    transitions = serializers.IntegerField(help_text="How many transitions it has taken.")
    definition_hash = serializers.CharField()
    definition_version = serializers.CharField(allow_null=True)
    updated_at = serializers.DateTimeField()

    def get_fields(self) -> dict[str, Any]:
        fields = super().get_fields()
        # The machine's data; declared here, as a class attribute would hide Serializer.data.
        fields["data"] = serializers.DictField()
        return fields


class WorkflowStatusSerializer(serializers.Serializer[Any]):
    """The fields of ``queuety.workflow_status()``."""

    id = serializers.IntegerField()
    name = serializers.CharField()
    status = serializers.CharField()
    current_step = serializers.IntegerField()
    total_steps = serializers.IntegerField()
    current_step_name = serializers.CharField(allow_null=True)
    state = serializers.DictField()
    error = serializers.DictField(allow_null=True)
    definition_hash = serializers.CharField()
    definition_version = serializers.CharField(allow_null=True)
    idempotency_key = serializers.CharField(allow_null=True)
    budget = serializers.DictField(allow_null=True)
    retry_policy = serializers.CharField(allow_null=True)
    wait_type = serializers.CharField(allow_null=True)
    waiting_for = serializers.ListField(child=serializers.CharField(), allow_null=True)
    wait_mode = serializers.CharField(allow_null=True)
    wait_details = WaitDetailsSerializer(allow_null=True)
    progress = ProgressSerializer(allow_null=True)
    artifact_count = serializers.IntegerField()
    artifact_keys = serializers.ListField(child=serializers.CharField())
    tags = serializers.DictField(child=serializers.CharField(),
                                 help_text="The run's tags ({key: value}).")
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    machine = MachineStatusSerializer(
        allow_null=True, required=False,
        help_text="GET runs/<id>/ only: a state machine run's current state and history "
                  "(null for a workflow run).")


class SignalReceiptSerializer(serializers.Serializer[Any]):
    """What a delivered signal or reply did."""

    signal_id = serializers.IntegerField()
    run_id = serializers.IntegerField()
    name = serializers.CharField()
    settled = serializers.BooleanField()
    status = serializers.CharField()


class ErrorSerializer(serializers.Serializer[Any]):
    """Every error: ``detail`` and ``code``; 400 adds ``errors``, a budget 409 its figures."""

    detail = serializers.CharField()
    code = serializers.CharField()
    # As ProgressSerializer.data: a declared field, popped off the class by the metaclass, not
    # Serializer.errors.
    errors = serializers.ListField(  # type: ignore[assignment]
        child=serializers.DictField(), required=False)
    budget = serializers.CharField(required=False)
    limit = serializers.IntegerField(required=False)
    used = serializers.IntegerField(required=False)
    known = serializers.ListField(child=serializers.CharField(), required=False,
                                  help_text="unknown_workflow: the registered names.")


class WaitingRunSerializer(serializers.Serializer[Any]):
    """A run waiting on a person, for ``GET waits/``."""

    id = serializers.IntegerField()
    name = serializers.CharField()
    step_name = serializers.CharField()
    human_wait = serializers.CharField()
    waiting_since = serializers.DateTimeField()
    expires_at = serializers.DateTimeField(
        allow_null=True, help_text="When the wait's timeout settles it; null: no timeout.")
    schema = serializers.DictField(allow_null=True)


class RunSummarySerializer(serializers.Serializer[Any]):
    """A run in ``GET runs/``: its row, without its state."""

    id = serializers.IntegerField()
    name = serializers.CharField()
    status = serializers.CharField()
    current_step = serializers.IntegerField()
    total_steps = serializers.IntegerField()
    current_step_name = serializers.CharField(allow_null=True)
    definition_hash = serializers.CharField()
    definition_version = serializers.CharField(allow_null=True)
    idempotency_key = serializers.CharField(allow_null=True)
    parent_id = serializers.IntegerField(allow_null=True)
    tags = serializers.DictField(child=serializers.CharField(),
                                 help_text="The run's tags ({key: value}).")
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)


class RunPageSerializer(serializers.Serializer[Any]):
    """A page of ``GET runs/``: follow ``next`` (a URL with a cursor) for older runs."""

    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = RunSummarySerializer(many=True)


class StartRunSerializer(serializers.Serializer[Any]):
    """The body of ``POST runs/``."""

    workflow = serializers.CharField(help_text="A registered workflow's name (GET workflows/).")
    payload = serializers.DictField(required=False, allow_null=True,
                                    help_text="The run's initial state, a JSON object.")
    idempotency_key = serializers.CharField(
        required=False, allow_null=True, max_length=255,
        help_text="A key already used answers with the run it started (200, created false).")
    tags = serializers.DictField(
        child=serializers.CharField(), required=False, allow_null=True,
        help_text="The run's tags ({\"customer\": \"42\"}), merged over the workflow's "
                  "with_tags().")
    key = serializers.CharField(
        required=False, allow_null=True, max_length=255,
        help_text="The run's flow-control key: debounce, singleton and batch act per key.")
    debounce = serializers.FloatField(
        required=False, allow_null=True,
        help_text="Seconds the key must stay quiet before its one run starts (last payload).")
    singleton = serializers.BooleanField(
        required=False, help_text="At most one live run of the key; on_conflict says what "
                                  "a start does while one is live.")
    on_conflict = serializers.ChoiceField(
        choices=["reject", "queue", "replace", "signal", "existing"], required=False,
        allow_null=True,
        help_text="With singleton: reject (409 run_conflict, the default), queue, replace, "
                  "signal or existing (answer with the live run's id, starting nothing).")
    signal = serializers.CharField(
        required=False, help_text="With on_conflict signal: the signal's name (default input).")
    batch = serializers.DictField(
        required=False, allow_null=True,
        help_text='Collect the key\'s payloads into one run: {"max_items": n, "max_wait": s}.')


class StartedRunSerializer(serializers.Serializer[Any]):
    """What ``POST runs/`` answers: the run, and whether this request created it."""

    created = serializers.BooleanField()
    run = WorkflowStatusSerializer()


class RegisteredWorkflowSerializer(serializers.Serializer[Any]):
    """A registered workflow, in ``GET workflows/``."""

    name = serializers.CharField()
    version = serializers.CharField(allow_null=True)
    definition_hash = serializers.CharField()
    steps = serializers.ListField(child=serializers.CharField())
    description = serializers.CharField(allow_blank=True)


class ArtifactSerializer(serializers.Serializer[Any]):
    """An artifact without its content (lists)."""

    key = serializers.CharField()
    kind = serializers.ChoiceField(choices=["json", "text", "markdown", "bytes"])
    size = serializers.IntegerField(help_text="Bytes of content.")
    metadata = serializers.DictField()
    step_index = serializers.IntegerField(allow_null=True)
    step_name = serializers.CharField(allow_blank=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class ArtifactContentSerializer(ArtifactSerializer):
    """An artifact with its content: a JSON value, a string, or base64 text for ``bytes``."""

    content = serializers.JSONField()


class ArtifactWriteSerializer(serializers.Serializer[Any]):
    """The body of ``PUT runs/<id>/artifacts/<key>/``."""

    content = serializers.JSONField(help_text="A JSON value (kind json), a string (text, "
                                              "markdown) or base64 text (bytes).")
    kind = serializers.ChoiceField(choices=["json", "text", "markdown", "bytes"],
                                   default="json")
    metadata = serializers.DictField(required=False, allow_null=True)


class ChunkSerializer(serializers.Serializer[Any]):
    """One chunk a streaming step yielded."""

    index = serializers.IntegerField()
    content = serializers.JSONField()
    attempt = serializers.IntegerField()
    created_at = serializers.DateTimeField()


class ChunkPageSerializer(serializers.Serializer[Any]):
    """The chunks of one step after a position."""

    step_name = serializers.CharField()
    step_run_id = serializers.IntegerField(allow_null=True)
    step_status = serializers.CharField(allow_null=True)
    finished = serializers.BooleanField()
    chunks = ChunkSerializer(many=True)


class DefinitionRefSerializer(serializers.Serializer[Any]):
    """The stored definition a bulk action acted on."""

    id = serializers.IntegerField()
    hash = serializers.CharField()
    workflow = serializers.CharField()


class BulkFailureSerializer(serializers.Serializer[Any]):
    """A run whose operation raised; nothing was written for it."""

    run_id = serializers.IntegerField()
    error = serializers.CharField()


class BulkResultSerializer(serializers.Serializer[Any]):
    """What pausing or resuming every run of one definition did
    (``queuety.quarantine.BulkResult.to_dict()``)."""

    action = serializers.ChoiceField(choices=["pause", "resume"])
    definition = DefinitionRefSerializer()
    paused = serializers.IntegerField(required=False, help_text="pause/: runs paused now.")
    resumed = serializers.IntegerField(required=False, help_text="resume/: runs resumed now.")
    skipped = serializers.DictField(
        child=serializers.IntegerField(),
        help_text="Runs left as they were, by reason: already_paused, waiting_for_workflows, "
                  "not_paused, finished, not_permitted, deleted, changed.")
    failed = BulkFailureSerializer(many=True)


class BulkRequestSerializer(serializers.Serializer[Any]):
    """The body of ``POST runs/bulk/``."""

    action = serializers.ChoiceField(choices=["cancel", "pause", "resume", "retry", "rewind",
                                              "migrate"])
    filter = serializers.DictField(
        required=False, help_text="The runs list's query keys: status, workflow, version, "
                                  "waiting, definition, older_than (7d, 12h, 90m or seconds), "
                                  "error_type, tag (a list of key:value, all must match).")
    dry_run = serializers.BooleanField(required=False, default=False)
    arguments = serializers.DictField(
        required=False, help_text="rewind: {\"step\": index or name}; migrate: {\"to\": "
                                  "\"latest\" | hash | id, \"step_map\": {old: new}}.")


class BulkProgressSerializer(serializers.Serializer[Any]):
    """A bulk operation's record and progress (``queuety.bulk_actions.BulkProgress``)."""

    id = serializers.IntegerField()
    action = serializers.CharField()
    status = serializers.ChoiceField(choices=["pending", "running", "done", "cancelled",
                                              "failed"])
    dry_run = serializers.BooleanField()
    filter = serializers.DictField()
    arguments = serializers.DictField()
    requested_by = serializers.CharField()
    matched = serializers.IntegerField(help_text="Runs the filter matched at the start.")
    acted = serializers.IntegerField()
    skipped = serializers.IntegerField()
    processed = serializers.IntegerField()
    skipped_reasons = serializers.DictField(child=serializers.IntegerField())
    error = serializers.CharField()
    created_at = serializers.DateTimeField(allow_null=True)
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)


class RetryRequestSerializer(serializers.Serializer[Any]):
    """The body of ``POST runs/<id>/retry/`` (optional: an empty body retries the failed
    step)."""

    from_step = serializers.JSONField(
        required=False, allow_null=True,
        help_text="A step's name (or index) at or before the failed step: run it and every "
                  "later step again, from the state it last started from.")


class EditStateRequestSerializer(serializers.Serializer[Any]):
    """The body of ``POST runs/<id>/edit-state/``."""

    patch = serializers.DictField(
        help_text='A JSON merge patch (RFC 7396): {"key": value} sets a key, objects merge, '
                  '{"key": null} deletes it.')
    reason = serializers.CharField(help_text="Why the state is edited (the timeline keeps it).")


class StateChangeSerializer(serializers.Serializer[Any]):
    """One change of a state edit; ``before``/``after`` absent for an added/removed key."""

    path = serializers.CharField(help_text="A JSON Pointer (RFC 6901) into the state.")
    before = serializers.JSONField(required=False)
    after = serializers.JSONField(required=False)


class StateEditSerializer(serializers.Serializer[Any]):
    """What ``POST runs/<id>/edit-state/`` answers: the changes and the run's status."""

    run_id = serializers.IntegerField()
    changes = StateChangeSerializer(many=True)
    run = WorkflowStatusSerializer()
