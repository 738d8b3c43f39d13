"""Errors raised by Queuety.

This module is pure Python (no Django, no Celery) so that the engine core can raise the same
classes the Django layer catches. Every class keeps the identifiers it mentions as attributes and
survives pickling, because Celery may carry it across processes.
"""

from __future__ import annotations

from typing import Any


class QueuetyError(Exception):
    """Base class of every Queuety error; not raised directly."""


class WorkflowDefinitionError(QueuetyError):
    """A workflow definition is invalid. Fix the builder call named in the message."""


class PermanentError(QueuetyError):
    """Raise from a step to fail it at once: a permanent error is never retried."""


class AgentReplayMismatch(PermanentError):
    """A retried agent step asked for something else than its recorded attempt did at the same
    point (another tool, other arguments, another request): the agent is not deterministic
    given its recorded responses, so the step fails instead of guessing."""

    def __init__(self, run_id: int, step: str, seq: int, what: str) -> None:
        super().__init__(
            f"Run {run_id}, step {step!r}: the replay of agent checkpoint {seq} does not match "
            f"what was recorded ({what}). An agent step must ask the same given the same "
            "responses; make the prompt, the deps and the tools deterministic, or start a new "
            "run.")
        self.run_id, self.step, self.seq, self.what = run_id, step, seq, what

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.run_id, self.step, self.seq, self.what))


class StepTimeout(QueuetyError, TimeoutError):
    """A step attempt ran past its ``timeout`` and was interrupted.

    It subclasses the builtin :class:`TimeoutError`, so ``retry_on=[TimeoutError]`` covers it.
    The outcome of an attempt whose deadline passed is a timeout whatever its body did after
    the interruption: a body that caught it and returned, or raised something else, still
    timed out, and what it produced late is kept in :attr:`late` for the timeline only.
    """

    #: What the body produced after its deadline, discarded: ``{"output": ...}`` when it
    #: caught the interruption and returned, ``{"error": {"type", "message"}}`` when it raised
    #: another error instead; None when the interruption ended it.
    late: dict[str, Any] | None = None


class TransitionFailed(PermanentError):
    """The database refused to record a step's outcome for a reason that trying again would
    not fix (a pooler that drops prepared statements, a schema that does not match the code).

    The step's output was discarded; the run fails at once with the database's error and the
    fix in its message, rather than after ``STALE_AFTER`` as a lost worker. Never retried:
    fix the cause, then ``retry()`` the run.
    """


class StepHeld(QueuetyError):
    """Raised by a step's handler to hand its attempt back unstarted: the attempt is not
    counted, the row holds no worker, and it is due again in ``seconds`` (a job throttled
    after exceptions, ``queuety.jobs.throttle``). Not a failure: no retry policy applies."""

    def __init__(self, seconds: float, reason: str) -> None:
        super().__init__(f"Held for {seconds:.1f} s: {reason}")
        self.seconds, self.reason = seconds, reason

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.seconds, self.reason))


class WorkerLost(QueuetyError):
    """The worker process running a step attempt died (killed, out of memory, host lost).

    Recorded by the sweeper when a ``processing`` step stops sending heartbeats. Worker losses are
    always retried while the step has attempts left, whatever ``retry_on`` says.
    """


class ChildRunFailed(QueuetyError):
    """The child run of a ``run_workflow`` step failed or was cancelled.

    Name it in the step's ``retry_on`` (or leave ``retry_on`` unset) to restart the child.
    """


class DeadlineExceeded(QueuetyError):
    """A run did not complete within its ``must_complete_within()`` deadline.

    Recorded as the failed run's error by the sweeper (``workflow_deadline_exceeded``); it is
    never raised to a caller. ``retry()`` gives the run a fresh deadline window.
    """


class WorkflowWaitFailed(QueuetyError):
    """A ``wait_for_workflows`` step can no longer be satisfied: runs it waits for failed,
    were cancelled or do not exist."""


class InvalidStepOutput(WorkflowDefinitionError):
    """A step returned something other than a JSON-serialisable dict or ``None``."""


class UnknownStep(WorkflowDefinitionError):
    """A step asked to jump (``_next_step``) to a step name the workflow does not define."""

    def __init__(self, message: str, name: str = "") -> None:
        super().__init__(message)
        self.name = name

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.args[0], self.name))


class BudgetExceeded(QueuetyError):
    """A run exceeded one of its budgets; it fails at once and is never retried.

    Attributes name the budget, its limit and the usage that breached it.
    """

    def __init__(self, budget: str, limit: int, used: int, run_id: int | None = None,
                 workflow: str = "", message: str | None = None) -> None:
        who = f"Run {run_id} of workflow {workflow!r}" if run_id else f"Workflow {workflow!r}"
        super().__init__(message or f"{who} exceeded its {budget} budget: {used} > {limit}.")
        self.budget, self.limit, self.used = budget, limit, used
        self.run_id, self.workflow = run_id, workflow

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.budget, self.limit, self.used, self.run_id, self.workflow,
                             self.args[0]))


class IdempotencyConflict(QueuetyError):
    """A dispatch reused an idempotency key with a different payload or definition.

    Raised only with ``idempotency_key(key, on_conflict="error")``; by default the original run's
    id is returned and the conflict is recorded on its timeline.
    """

    def __init__(self, key: str, run_id: int, differences: str = "payload") -> None:
        super().__init__(
            f"Idempotency key {key!r} already started run {run_id} with a different "
            f"{differences}; nothing new was dispatched. Use a new key for a new run."
        )
        self.key, self.run_id, self.differences = key, run_id, differences

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.run_id, self.differences))


class RunStateError(QueuetyError):
    """Base of the errors about what a run's current status allows; carries ``run_id``."""

    def __init__(self, run_id: int, message: str) -> None:
        super().__init__(message)
        self.run_id = run_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.run_id, self.args[0]))


class RunNotWaiting(RunStateError):
    """A signal or reply reached a run that cannot take it (finished, or not waiting for it).

    Nothing was recorded.
    """


class InvalidTransition(RunStateError):
    """An operation the run's status does not allow (resume a run that is not paused, ...)."""


class AlreadyAnswered(RunNotWaiting):
    """A reply reached a wait that a person has already answered; nothing was recorded."""


class WaitExpired(RunNotWaiting):
    """A reply or signal came for a wait that its timeout has already settled.

    The wait's ``on_timeout`` decided what the run did (failed it, went on, or jumped); the
    late reply was not recorded. Also the error of a run that ``on_timeout="fail"`` failed.
    """


class InvalidProgress(QueuetyError, ValueError):
    """``context.heartbeat(progress=...)`` was given something other than a small JSON object.

    Nothing was recorded; the step goes on (and fails only if it lets the error escape).
    """


class InvalidSignalData(QueuetyError, ValueError):
    """Signal data was refused (not JSON, too large, or failing the wait's JSON Schema).

    ``errors`` lists each problem as ``{"path": "/amount", "message": "..."}``. Nothing was
    recorded and the run keeps waiting.
    """

    def __init__(self, message: str, errors: list[dict[str, str]] | None = None,
                 too_large: bool = False) -> None:
        super().__init__(message)
        self.errors = errors or []
        self.too_large = too_large

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.args[0], self.errors, self.too_large))


class UnmatchedRoute(WorkflowDefinitionError):
    """A route step returned a label that matches none of its routes, and it has no DEFAULT."""

    def __init__(self, message: str, label: str = "", labels: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.label, self.labels = label, labels

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.args[0], self.label, self.labels))


class NotAMachine(QueuetyError, LookupError):
    """``machine_status()`` was asked about a run that is not a state machine's."""


class RunNotFound(QueuetyError, LookupError):
    """No workflow run has the given id."""

    def __init__(self, run_id: int) -> None:
        super().__init__(f"Workflow run {run_id} does not exist.")
        self.run_id = run_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.run_id,))


class BulkOperationNotFound(QueuetyError, LookupError):
    """No bulk operation (``queuety.bulk()``) has the given id."""

    def __init__(self, op_id: int) -> None:
        super().__init__(f"Bulk operation {op_id} does not exist; "
                         "'manage.py queuety workflow bulk-list' lists them.")
        self.op_id = op_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.op_id,))


class InvalidPayload(WorkflowDefinitionError, ValueError):
    """A payload given to dispatch is not a JSON object Queuety can store; nothing was
    written. (A :class:`WorkflowDefinitionError` too, which is what dispatch raised before.)"""


class InvalidStateEdit(QueuetyError, ValueError):
    """A state edit (``edit_state()``) whose patch, or the state it would make, a run cannot
    take: not a JSON object, a reserved ``_`` key, a value JSON cannot hold, over the run's
    ``max_state_bytes``. Nothing was changed."""


class UnknownWorkflow(QueuetyError, LookupError):
    """No workflow is registered under ``name``; ``known`` lists the registered names."""

    def __init__(self, name: str, known: tuple[str, ...] = ()) -> None:
        listed = ", ".join(repr(each) for each in known) if known else "none"
        super().__init__(
            f"No workflow is registered as {name!r}; the registered workflows are {listed}. "
            "Register it with queuety.register() in an installed app's workflows.py.")
        self.name, self.known = name, tuple(known)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.name, self.known))


class UnknownDefinition(QueuetyError, LookupError):
    """No stored workflow definition matches ``ref`` (a definition id, a hash, or a hash
    prefix of at least 8 characters), or a prefix matches more than one; nothing was done."""

    def __init__(self, ref: str, why: str = "") -> None:
        super().__init__(why or (
            f"No workflow definition has the id or hash {ref!r}; list them with "
            "'manage.py queuety workflow definitions' (or the admin's Workflow definitions)."))
        self.ref = ref

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.ref, self.args[0]))


class InvalidSchedule(QueuetyError, ValueError):
    """A schedule was refused (bad cron expression, interval, overlap policy, workflow or
    payload); nothing was written."""
class InvalidArtifact(QueuetyError, ValueError):
    """An artifact or a streamed chunk was refused: a bad key or kind, content that does not
    match its kind, or more bytes than ``QUEUETY["MAX_ARTIFACT_BYTES"]`` (chunks:
    ``MAX_CHUNK_BYTES``) allow. Nothing was written. ``too_large`` tells the size case apart.
    """

    def __init__(self, message: str, too_large: bool = False) -> None:
        super().__init__(message)
        self.too_large = too_large

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.args[0], self.too_large))


class ArtifactNotFound(QueuetyError, LookupError):
    """Run ``run_id`` has no artifact named ``key``."""

    def __init__(self, run_id: int, key: str) -> None:
        super().__init__(f"Workflow run {run_id} has no artifact {key!r}.")
        self.run_id, self.key = run_id, key

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.run_id, self.key))


#: Errors that mean the definition or the step's contract is wrong. Retrying cannot help.
NEVER_RETRIED: tuple[type[BaseException], ...] = (
    WorkflowDefinitionError, PermanentError, BudgetExceeded,
)


class InvalidMigration(QueuetyError, ValueError):
    """``migrate_runs()`` was given something it cannot do: a ``step_map`` naming unknown
    steps, a ``to`` of another workflow, a state function no worker can import. Nothing was
    changed."""


class InvalidSignature(QueuetyError):
    """An inbound webhook delivery's signature is missing, malformed, wrong or too old.

    Raised by the verifiers of ``queuety.verifiers``; the hook endpoint answers it with a
    401 and stores nothing.
    """


class RunConflict(QueuetyError):
    """A start with ``singleton=True, on_conflict="reject"`` found a live run of its key;
    nothing was started. ``key`` and ``run_id`` (the live run) say which. The REST API
    answers it with a 409."""

    def __init__(self, workflow: str, key: str, run_id: int) -> None:
        super().__init__(
            f"Run {run_id} of workflow {workflow!r} with key {key!r} is still live, and this "
            f"start asked for singleton=True with on_conflict='reject'; nothing was started. "
            "Wait for that run to finish, cancel it, or start with on_conflict='queue', "
            "'replace' or 'signal'.")
        self.workflow, self.key, self.run_id = workflow, key, run_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.workflow, self.key, self.run_id))


class RunPurged(QueuetyError):
    """A dispatch reused an idempotency key whose run retention purged: the key is kept as a
    tombstone (until the run's own retention passes again), so it neither starts a second run
    nor answers with the id of a run that no longer exists. The REST API answers a 409."""

    def __init__(self, key: str, workflow: str, run_id: int, purged_at: str) -> None:
        # A key with no tombstone whose run is gone (purged before tombstones existed, or
        # deleted by hand) names no workflow and no date (both "").
        gone = (f"of workflow {workflow!r}, which retention purged on {purged_at}" if workflow
                else f"which was purged before {purged_at}" if purged_at
                else "which no longer exists")
        super().__init__(
            f"Idempotency key {key!r} started run {run_id}, {gone}; nothing was dispatched. "
            "Use a new key for a new run, or bring the run back with 'manage.py queuety "
            "archive import'.")
        self.key, self.workflow, self.run_id, self.purged_at = key, workflow, run_id, purged_at

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.workflow, self.run_id, self.purged_at))


class PurgeRunning(QueuetyError):
    """Another purge pass (``manage.py queuety purge`` or the sweeper's phase) holds the
    purge lock; this one did nothing."""

    def __init__(self) -> None:
        super().__init__(
            "Another purge pass is running (manage.py queuety purge, or the sweeper's purge "
            "phase); nothing was purged by this one. Run it again when that one has ended.")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), ())


class ArchiveError(QueuetyError):
    """The run archive could not be read (``queuety.archive``): an object that does not
    exist, a line that is not JSON."""
