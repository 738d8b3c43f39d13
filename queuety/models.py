"""Storage for definitions, runs, step executions and the event timeline.

Models hold no workflow rules: those live in ``queuety.core``; ``queuety.runtime`` and the use
cases above it (``dispatch``, ``inbox``, ``operations``, ...) move data between the two.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.conf import settings as dj_settings
from django.contrib.postgres.indexes import GinIndex
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import F, Q
from django.db.models.fields.json import KeyTextTransform, KeyTransform

from queuety.conf import settings
from queuety.core import addresses
from queuety.core.status import UNFINISHED

# The core's status vocabulary, re-exported: the storage speaks the same words (and its
# ``choices`` are labelled as ``TextChoices`` would label them, so no migration changes).
from queuety.core.status import RunStatus as RunStatus
from queuety.core.status import StepStatus as StepStatus


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


class TagsIndex(GinIndex):
    """The GIN index (``jsonb_path_ops``) of the runs' ``tags`` on PostgreSQL, which serves
    containment (``tags @> '{"customer": "42"}'``); a plain index elsewhere (SQLite has no
    GIN, and no filter of its needs one)."""

    def __init__(self, *, name: str) -> None:
        super().__init__(fields=["tags"], opclasses=["jsonb_path_ops"], name=name)

    def deconstruct(self) -> tuple[str, tuple[()], dict[str, str]]:
        return "queuety.models.TagsIndex", (), {"name": self.name}

    def create_sql(self, model: Any, schema_editor: Any, using: str = "",
                   **kwargs: Any) -> Any:
        if schema_editor.connection.vendor != "postgresql":
            return models.Index(fields=["tags"], name=self.name).create_sql(
                model, schema_editor, using, **kwargs)
        return super().create_sql(model, schema_editor, using, **kwargs)


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


class WebhookEndpoint(models.Model):
    """An address that receives the events it subscribes to, signed with its secret.

    The secret signs each delivery (HMAC-SHA256); the admin never shows it back and nothing
    logs it.
    """

    url = models.URLField(max_length=2000, help_text="Where deliveries are POSTed (http or https).")
    events = models.JSONField(default=list, help_text="The event names it receives, such as "
                              "['run.failed', 'run.completed'].")
    secret = models.CharField(max_length=255, help_text="Signs each delivery (HMAC-SHA256).")
    active = models.BooleanField(default=True)
    description = models.CharField(max_length=255, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"webhook {self.pk} -> {self.url}"

    def clean(self) -> None:
        """Refuse a URL whose host is loopback, private, link-local or otherwise not public
        (SSRF), unless ``QUEUETY["WEBHOOK_ALLOW_PRIVATE"]``; delivery checks the resolved
        addresses again."""
        super().clean()
        refusal = None if settings.WEBHOOK_ALLOW_PRIVATE else addresses.url_refusal(self.url)
        if refusal is not None:
            raise ValidationError({"url": refusal})


class WebhookDelivery(models.Model):
    """One event for one endpoint: written in the event's transaction, sent by a Celery task
    (``queuety.deliver_webhook``) with retries and back-off, so it survives a worker crash."""

    PENDING, SENDING, DELIVERED, FAILED = "pending", "sending", "delivered", "failed"
    STATUSES = [(s, s) for s in (PENDING, SENDING, DELIVERED, FAILED)]

    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE,
                                 related_name="deliveries")
    event = models.CharField(max_length=64)
    event_id = models.UUIDField(help_text="The same for every attempt and redelivery: a "
                                "receiver dedupes on it.")
    run_id = models.BigIntegerField(null=True, blank=True, db_index=True)
    payload = models.JSONField()
    status = models.CharField(max_length=16, choices=STATUSES, default=PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "webhook deliveries"
        indexes = [models.Index(fields=["next_attempt_at"], name="queuety_webhook_due",
                                condition=Q(status__in=["pending", "sending"]))]

    def __str__(self) -> str:
        return f"{self.event} -> endpoint {self.endpoint_id} ({self.status})"


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


#: What a job's workflow name starts with (``queuety.jobs.specs.PREFIX``, which sits above the
#: models; a unit test keeps them equal).
JOB_PREFIX = "task:"


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


class InboundDelivery(models.Model):
    """One delivery received by an inbound hook (``queuety.inbound``): verified, stored and
    acted on in one transaction; the provider's retries of it find this row and start nothing.

    ``headers`` are kept without the signature and credential headers.
    """

    STARTED, SIGNALLED, FAILED = "started", "signalled", "failed"
    OUTCOMES = [(o, o) for o in (STARTED, SIGNALLED, FAILED)]

    hook = models.CharField(max_length=100)
    event_id = models.CharField(max_length=255, help_text="The provider's id of the delivery "
                                "(what its retries share): it deduplicates them.")
    received_at = models.DateTimeField(auto_now_add=True)
    headers = models.JSONField(default=dict)
    body = models.TextField(help_text="The raw body, as it was signed.")
    outcome = models.CharField(max_length=16, choices=OUTCOMES)
    run_id = models.BigIntegerField(null=True, blank=True, db_index=True,
                                    help_text="The run it started or signalled.")
    error = models.TextField(blank=True, default="")

    class Meta:
        verbose_name_plural = "inbound deliveries"
        constraints = [models.UniqueConstraint(fields=["hook", "event_id"],
                                               name="queuety_inbound_once")]
        indexes = [models.Index(fields=["hook", "received_at"], name="queuety_inbound_hook")]

    def __str__(self) -> str:
        return f"{self.hook} delivery {self.event_id} ({self.outcome})"


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

    class Meta:
        indexes = [models.Index(fields=["status"], name="queuety_bulk_live",
                                condition=Q(status__in=["pending", "running"]))]

    def __str__(self) -> str:
        return f"bulk {self.action} #{self.pk} ({self.status})"
