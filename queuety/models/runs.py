"""Definitions, runs, their steps, signals, replies and the event timeline."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import F, Q
from django.db.models.fields.json import KeyTextTransform, KeyTransform

from queuety.core.status import UNFINISHED, RunStatus, StepStatus


class WorkflowDefinition(models.Model):
    """One exact shape of a workflow. Immutable: a changed definition is a new row."""

    name = models.CharField(max_length=255)
    definition = models.JSONField(help_text="The canonical JSON the hash digests.")
    definition_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["name", "definition_hash"], name="queuety_def_name_hash")
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.definition_hash[:12]})"


class TagsIndex(models.Index):
    """The GIN index (``jsonb_path_ops``) of the runs' ``tags`` on PostgreSQL, which serves
    containment (``tags @> '{"customer": "42"}'``); a plain index elsewhere (SQLite has no
    GIN, and no filter of its needs one).

    A plain ``Index`` that writes ``USING gin`` itself rather than
    ``django.contrib.postgres``'s ``GinIndex``: Django 6.0 requires ``django.contrib.postgres``
    in ``INSTALLED_APPS`` for that one (``postgres.E005``), and a site installing Queuety
    should not have to add it."""

    def __init__(self, *, name: str) -> None:
        super().__init__(fields=["tags"], name=name)

    def deconstruct(self) -> tuple[str, tuple[()], dict[str, str]]:
        return "queuety.models.TagsIndex", (), {"name": self.name}

    def create_sql(self, model: Any, schema_editor: Any, using: str = "",
                   **kwargs: Any) -> Any:
        if schema_editor.connection.vendor != "postgresql":
            return super().create_sql(model, schema_editor, using, **kwargs)
        gin = models.Index(fields=["tags"], opclasses=["jsonb_path_ops"], name=self.name)
        return gin.create_sql(model, schema_editor, using=" USING gin", **kwargs)


class WorkflowRun(models.Model):
    """One execution of a workflow definition, with its public state."""

    definition = models.ForeignKey(WorkflowDefinition, on_delete=models.PROTECT, related_name="runs")
    name = models.CharField(max_length=255, db_index=True)
    status = models.CharField(max_length=32, choices=RunStatus.choices,
                              default=RunStatus.RUNNING.value)
    state = models.JSONField(default=dict, help_text="Public state: no reserved '_' keys.")
    current_step = models.PositiveIntegerField(default=0)
    total_steps = models.PositiveIntegerField()
    # Bumped by every write to the run row: the step boundary's compare-and-set guard.
    revision = models.PositiveIntegerField(default=0)
    idempotency_key = models.CharField(max_length=255, null=True, blank=True, db_index=True)
    # The flow-control key of a keyed run (queuety.keyed): signal-with-start, debounce,
    # singleton and batch find a workflow's live run of a key by it.
    key = models.CharField(max_length=255, null=True, blank=True)
    # Budget usage (limits live in the definition).
    transitions = models.PositiveIntegerField(default=0)
    cost_units = models.PositiveIntegerField(default=0)
    started_workflows = models.PositiveIntegerField(default=0)
    error = models.JSONField(null=True, blank=True)
    deadline_at = models.DateTimeField(null=True, blank=True)
    # Compensations and hooks queued after a cancel, failure or deadline: the queue and the
    # position of the next one. Set at most once per run.
    cleanup = models.JSONField(null=True, blank=True)
    # Set for a child run started by run_workflow(): the parent run and its step.
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="children")
    parent_step = models.PositiveIntegerField(null=True, blank=True)
    # For a run_workflow child: which attempt of the parent's step it is (restarts count up).
    parent_attempt = models.PositiveIntegerField(default=1, db_default=1)
    # Set for a run started by a start_workflows() step: that run, its step and its group.
    started_by = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="started")
    started_by_step = models.PositiveIntegerField(null=True, blank=True)
    group = models.CharField(max_length=255, blank=True, default="", db_default="")
    # The runs this run's start_workflows steps started, by group key ({group: [ids]}); a start
    # step entered again replaces its group, and fork and replay carry them over.
    groups = models.JSONField(default=dict, blank=True, db_default={})
    # Iterations of each repeat step's current loop ({step index: n}); reset when it exits.
    loops = models.JSONField(default=dict, blank=True)
    # For a workflow with prune_state_after(n): the transition that last wrote each state key
    # ({key: transition}), so a key is dropped n transitions after its last write.
    state_writes = models.JSONField(default=dict, blank=True, db_default={})
    # While the run is parked at a wait with a timeout: when the sweeper settles it by timeout.
    wait_expires_at = models.DateTimeField(null=True, blank=True)
    # While the run is parked at a wait with reminders: when the next reminder is due (None:
    # none left), when the run parked there, and how many were sent. The sweeper claims each
    # reminder by a compare-and-set of remind_at, so it is sent once however many sweep.
    remind_at = models.DateTimeField(null=True, blank=True)
    waiting_since = models.DateTimeField(null=True, blank=True)
    reminders = models.IntegerField(default=0, db_default=0)
    # The W3C trace context (traceparent) of the span that dispatched the run, when tracing
    # is on: each step attempt's span joins that trace, whichever process runs it and when.
    trace_context = models.CharField(max_length=512, blank=True, default="", db_default="")
    # A move onto another definition (migrate_runs()) asked for while the run was in the
    # middle of a step: applied by the run's next landing, then cleared. {"to": definition id,
    # "step_map": {...}, "state": dotted path or None, "by": actor, "requested_at": iso}
    migration = models.JSONField(null=True, blank=True)
    # Set (without a revision bump: it is no part of the run) by a workflow wait that names
    # this run, on the row its finish updates: the finishing statement returns it, and only an
    # awaited run, or one with a parent, then reads its waiters (queuety.store.sql).
    awaited = models.BooleanField(default=False, db_default=False)
    # The run's tags ({key: value}, strings; queuety.core.tags): given at dispatch, by the
    # builder's with_tags() and by context.tag() in a step. A GIN index (jsonb_path_ops)
    # serves the filters, which are containment (tags @> {...}).
    tags = models.JSONField(default=dict, blank=True, db_default={})
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Set when ``archive import`` brought the run back from an archive: retention counts from
    # the later of this and finished_at, so a restored run is not purged again at once.
    restored_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["status", "-id"], name="queuety_run_status"),
            models.Index(fields=["deadline_at"], name="queuety_run_deadline",
                         condition=Q(deadline_at__isnull=False)),
            models.Index(fields=["status", "finished_at"], name="queuety_run_finished"),
            # The sweeper's expiry scan reads only runs parked at a timed wait.
            models.Index(fields=["wait_expires_at"], name="queuety_run_wait_expiry",
                         condition=Q(status="waiting_for_signal",
                                     wait_expires_at__isnull=False)),
            # A keyed start reads only the live runs of its key.
            models.Index(fields=["name", "key", "id"], name="queuety_run_key_live",
                         condition=Q(key__isnull=False, status__in=list(UNFINISHED))),
            # The sweeper's expiry scan reads parked runs of both timed waits in one query
            # (its IN-list must match the predicate for PostgreSQL to use the index).
            models.Index(fields=["wait_expires_at"], name="queuety_run_timed_expiry",
                         condition=Q(status__in=["waiting_for_signal", "waiting_for_workflows"],
                                     wait_expires_at__isnull=False)),
            # The sweeper's reminder scan reads only parked runs with a reminder due some day.
            models.Index(fields=["remind_at"], name="queuety_run_remind",
                         condition=Q(status__in=["waiting_for_signal", "waiting_for_workflows"],
                                     remind_at__isnull=False)),
            # GET runs/?tag=customer:42 (tags @> '{"customer": "42"}').
            TagsIndex(name="queuety_run_tags"),
            # A bulk operation's chunks by workflow or definition, in id order (keyset).
            models.Index(fields=["name", "id"], name="queuety_run_name_id"),
            models.Index(fields=["definition", "id"], name="queuety_run_definition_id"),
        ]
        permissions = [
            ("signal_workflowrun", "Can send signals, approvals and input to workflow runs"),
        ]

    def __str__(self) -> str:
        return f"{self.name} #{self.pk} ({self.status})"


class DispatchKey(models.Model):
    """A used idempotency key and the run it started. Global.

    ``run_id`` is a plain integer, not a foreign key. When retention purges the run, the key
    stays as a tombstone (``purged_at`` set): a dispatch reusing it raises ``RunPurged``
    instead of answering with a dangling id, until ``forget_at`` (the purge plus the run's
    own retention), when the sweeper deletes the key.
    """

    key = models.CharField(max_length=255, unique=True)
    run_id = models.BigIntegerField()
    payload_hash = models.CharField(max_length=64)
    definition_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    purged_at = models.DateTimeField(null=True, blank=True)
    purged_workflow = models.CharField(max_length=255, blank=True, default="", db_default="")
    forget_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "queuety_workflow_dispatch_keys"
        indexes = [models.Index(fields=["forget_at"], name="queuety_key_forget",
                                condition=Q(forget_at__isnull=False))]

    def __str__(self) -> str:
        return f"{self.key} -> run {self.run_id}"


class StepRun(models.Model):
    """One execution of one step of a run, across its attempts.

    ``seq`` is the run's transition count when the row was created, so each visit of a step
    (a ``_next_step`` loop visits a step again) has its own row, and a unique constraint makes
    a duplicated transition impossible.
    """

    # No index of its own: the unique (run, kind, seq, branch) constraint leads with run.
    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="steps",
                            db_index=False)
    # "step": a step of the workflow; "compensation" / "hook": cleanup after a cancel, failure
    # or deadline, which runs whatever the run's status.
    kind = models.CharField(max_length=16, default="step", db_default="step")
    seq = models.PositiveIntegerField()
    branch = models.PositiveIntegerField(default=0, help_text="Branch or item of a fan-out step.")
    step_index = models.PositiveIntegerField()
    step_name = models.CharField(max_length=255)
    status = models.CharField(max_length=16, choices=StepStatus.choices,
                              default=StepStatus.PENDING.value)
    attempt = models.PositiveIntegerField(default=0, help_text="Attempts claimed so far.")
    max_attempts = models.PositiveIntegerField(default=1)
    timeout = models.FloatField(null=True, blank=True)
    available_at = models.DateTimeField()
    # When a message for this row was last handed to the broker (for a delayed message: when
    # it is due). The sweeper re-publishes due rows whose message looks lost.
    published_at = models.DateTimeField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    claimed_by = models.CharField(max_length=255, blank=True, default="", db_default="",
                                  help_text="host:pid of the process running the attempt.")
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # What the handler last reported with context.heartbeat(progress={...}).
    progress = models.JSONField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    handler = models.CharField(max_length=255, blank=True, default="", db_default="",
                               help_text="For cleanup rows: the handler to call.")
    input = models.JSONField(null=True, blank=True, help_text="For cleanup rows: their input.")
    output = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Resource control (queuety.runtime.gates), written only for steps with limits: plain
    # rows keep the defaults and are never counted.
    concurrency_group = models.CharField(max_length=255, blank=True, default="", db_default="",
                                         help_text="The group key this attempt counts in.")
    queue = models.CharField(max_length=255, blank=True, default="", db_default="",
                             help_text="The Celery queue whose cost budget this attempt uses.")
    cost_units = models.PositiveIntegerField(default=0, db_default=0)
    priority = models.SmallIntegerField(default=1, db_default=1,
                                        help_text="2 high, 1 normal, 0 low.")
    # The attempt a gate admitted: a processing row counts against its group only when this
    # equals its attempt, so a claimed row not yet through its gate is never counted.
    admitted_attempt = models.PositiveIntegerField(default=0, db_default=0)
    # A throttled row a released slot woke: pending, its message on the way; it keeps that
    # slot reserved until its gate admits it.
    woken = models.BooleanField(default=False, db_default=False)
    throttled_by = models.JSONField(null=True, blank=True,
                                    help_text="Why the step waits: {group, reason, ...}.")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run", "kind", "seq", "branch"], name="queuety_step_run_seq_branch"
            )
        ]
        indexes = [
            models.Index(
                fields=["available_at"], name="queuety_step_due",
                condition=Q(status="pending"),
            ),
            # The sweeper's scan for queued keyed runs left held (runtime/finish.py).
            models.Index(
                fields=["id"], name="queuety_step_queued",
                condition=Q(status="held", kind="step", seq=0),
            ),
            models.Index(
                fields=["heartbeat_at"], name="queuety_step_live",
                condition=Q(status="processing"),
            ),
            models.Index(
                fields=["concurrency_group"], name="queuety_step_group_live",
                condition=Q(status__in=["processing", "pending"]) & ~Q(concurrency_group=""),
            ),
            models.Index(
                fields=["concurrency_group", "-priority", "id"], name="queuety_step_throttled",
                condition=Q(status="throttled"),
            ),
            models.Index(
                fields=["queue"], name="queuety_step_queue_held",
                condition=Q(status__in=["processing", "pending"]) & ~Q(queue=""),
            ),
            models.Index(
                fields=["queue", "concurrency_group", "-priority", "id"],
                name="queuety_step_queue_waiting",
                condition=Q(status="throttled") & ~Q(queue=""),
            ),
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.step_name!r} #{self.seq} ({self.status})"


class WorkflowDependency(models.Model):
    """A run parked at a ``wait_for_workflows`` step, and one run it waits for.

    Indexed by the awaited run, so a run that finishes finds its waiters with one query.
    ``depends_on`` is a plain id, not a foreign key: an awaited run may never have existed or
    may be purged, and the wait must then fail rather than lose its row.
    """

    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="dependencies")
    step_index = models.PositiveIntegerField()
    depends_on = models.BigIntegerField(db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "step_index", "depends_on"],
                                               name="queuety_dependency_unique")]

    def __str__(self) -> str:
        return f"run {self.run_id} waits for run {self.depends_on}"


class Signal(models.Model):
    """A signal sent to a run: stored until a wait consumes it (possibly before it is reached)."""

    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="signals")
    name = models.CharField(max_length=255)
    payload = models.JSONField(null=True, blank=True)
    sent_by = models.CharField(max_length=255, blank=True, default="")
    received_at = models.DateTimeField(auto_now_add=True)
    consumed_at = models.DateTimeField(null=True, blank=True)
    consumed_by_step = models.CharField(max_length=255, blank=True, default="")
    # Makes a retried delivery harmless (approval tokens use it to be single-use).
    dedupe_key = models.CharField(max_length=255, null=True, blank=True, unique=True)

    class Meta:
        indexes = [models.Index(fields=["run", "id"], name="queuety_signal_unconsumed",
                                condition=Q(consumed_at__isnull=True))]

    def __str__(self) -> str:
        return f"run {self.run_id}: {self.name}"


class ApiReply(models.Model):
    """The first response to a POST that carried an ``Idempotency-Key`` header."""

    user_id = models.BigIntegerField()
    key = models.CharField(max_length=255)
    method = models.CharField(max_length=8)
    path = models.CharField(max_length=1024)
    status_code = models.PositiveSmallIntegerField()
    body = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user_id", "key"],
                                               name="queuety_api_reply_user_key")]

    def __str__(self) -> str:
        return f"{self.method} {self.path} [{self.key}] -> {self.status_code}"


#: The exception type an event's error records (``data["error"]["type"]``, as
#: ``core.engine.describe_error`` writes it): the expression the error-type index holds and
#: the log's ``error_type`` filter compares, so the planner matches the two.
ERROR_TYPE = KeyTextTransform("type", KeyTransform("error", "data"))


class Event(models.Model):
    """An entry of a run's append-only timeline."""

    # No index of its own: queuety_event_run (run, id) leads with run.
    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="events",
                            db_index=False)
    step_run = models.ForeignKey(StepRun, null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="+", db_constraint=False)
    kind = models.CharField(max_length=40)
    step_index = models.PositiveIntegerField(null=True, blank=True)
    step_name = models.CharField(max_length=255, blank=True, default="")
    attempt = models.PositiveIntegerField(null=True, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            models.Index(fields=["run", "id"], name="queuety_event_run"),
            # The cross-run log (queuety.events_query) reads newest first by (created_at, id),
            # each filter from an index that ends with that order (migration 0019).
            models.Index(fields=["created_at", "id"], name="queuety_event_created"),
            models.Index(fields=["kind", "created_at", "id"], name="queuety_event_kind"),
            models.Index(fields=["run", "created_at", "id"], name="queuety_event_run_created"),
            models.Index(ERROR_TYPE, F("created_at"), F("id"), name="queuety_event_error_type",
                         condition=Q(data__has_key="error")),
        ]

    def __str__(self) -> str:
        return f"run {self.run_id}: {self.kind}"

