"""What steps produce beside their state: artifacts, streamed chunks, and agent checkpoints."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from queuety.models.runs import WorkflowRun


class Artifact(models.Model):
    """A named output of a run, kept outside its public state (``queuety.put_artifact``).

    A row written inside a step attempt is ``visible=False`` and tagged with that attempt
    (``step_run_id``, ``attempt``) until the attempt's outcome is recorded, in the transaction
    that records it; only then does it replace the visible row of the same key. One visible
    row per (run, key); one pending row per (run, key, attempt).
    """

    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="artifacts",
                            db_index=False)
    key = models.CharField(max_length=255)
    kind = models.CharField(max_length=16)
    content = models.BinaryField()
    size = models.PositiveIntegerField(help_text="Bytes of content.")
    metadata = models.JSONField(default=dict, blank=True)
    step_index = models.PositiveIntegerField(null=True, blank=True)
    step_name = models.CharField(max_length=255, blank=True, default="")
    # The attempt that wrote it (None when written from outside a step).
    step_run_id = models.BigIntegerField(null=True, blank=True)
    attempt = models.PositiveIntegerField(null=True, blank=True)
    visible = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "key"], condition=Q(visible=True),
                                    name="queuety_artifact_visible_key"),
            models.UniqueConstraint(fields=["run", "key", "step_run_id", "attempt"],
                                    condition=Q(visible=False),
                                    name="queuety_artifact_pending_key"),
        ]
        indexes = [models.Index(fields=["step_run_id", "attempt"], name="queuety_artifact_attempt",
                                condition=Q(visible=False))]

    def __str__(self) -> str:
        return f"run {self.run_id}: artifact {self.key!r} ({self.kind}, {self.size} bytes)"


class StepChunk(models.Model):
    """One chunk a streaming step yielded, stored as it was yielded (JSON text).

    Kept across the step row's attempts (a retry reads them back) and after the step
    completes (a late reader still sees the whole stream); purged with the run.
    """

    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="chunks",
                            db_index=False)
    step_run_id = models.BigIntegerField()
    step_index = models.PositiveIntegerField()
    step_name = models.CharField(max_length=255)
    index = models.PositiveIntegerField(help_text="0 for the step row's first chunk.")
    attempt = models.PositiveIntegerField()
    content = models.TextField(help_text="The chunk as compact JSON.")
    created_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["step_run_id", "index"],
                                               name="queuety_chunk_step_index")]
        indexes = [models.Index(fields=["run", "step_name", "step_run_id", "index"],
                                name="queuety_chunk_run_step")]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.step_name!r} chunk {self.index}"


class AgentCheckpoint(models.Model):
    """One completed model request or tool call of an agent step (``queuety.contrib.
    pydantic_ai``), written in its own transaction as it completes.

    A later attempt of the same step row replays it instead of calling the model or the tool
    again. Model requests are numbered in order (``seq`` 1, 2, ...); a tool call is keyed by the
    request whose response asked for it (``seq``) and its tool call id (``key``), since the
    tool calls of one response may run, and complete, in any order.
    """

    KIND_MODEL, KIND_TOOL, KIND_RETRY = "model", "tool", "retry"

    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="+",
                            db_index=False)
    step_run = models.ForeignKey("StepRun", on_delete=models.CASCADE, related_name="+",
                                 db_index=False)
    step_index = models.PositiveIntegerField()
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=8, choices=[
        (KIND_MODEL, "model request"), (KIND_TOOL, "tool call"),
        (KIND_RETRY, "tool call that asked the model to retry (ModelRetry)")])
    key = models.CharField(max_length=255, blank=True, default="")
    name = models.CharField(max_length=255, help_text="The model or the tool.")
    fingerprint = models.CharField(max_length=64, help_text=(
        "What was asked (the request's parts, the tool's name and arguments): a replay that "
        "asks something else is non-deterministic."))
    payload = models.JSONField(help_text="The ModelResponse, the tool's return value, or the "
                               "ModelRetry's message.")
    tokens = models.PositiveIntegerField(default=0)
    attempt = models.PositiveIntegerField()
    created_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["step_run", "kind", "seq", "key"],
                                               name="queuety_agent_checkpoint_seq")]
        indexes = [models.Index(fields=["run", "step_index", "seq"],
                                name="queuety_agent_checkpoint_run")]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.step_index} {self.kind} {self.seq} {self.key}"

