"""Queue operations: pause, resume and drain a Celery queue, and each queue's numbers.

A *queue* is the Celery queue a step's messages go to, as Queuety sends them: the step's own
``queue``, else its workflow's ``.on_queue()``, else ``QUEUETY["QUEUE"]``, else Celery's
default queue (``task_default_queue``, normally ``celery``). Queues are site-wide: a pause
holds every run's steps on that queue.

While a queue is paused (a :class:`~queuety.models.QueuePause` row), a step whose message
reaches a worker from it is not claimed: its row waits THROTTLED with ``throttled_by``
``{"group": None, "reason": "queue paused", "queue": <name>, ...}``, its attempt not counted
and nothing failed. The test is folded into the claim's own statement, so it costs the step
boundary no statement. Resuming deletes the pause and publishes the held rows again (due
now); each then passes its resource gate as any claimed step does.

A run's next step that its worker would continue inline (same queue, no message) is not taken
either: the transition's own statement tests the pause too, inserts the row pending and
publishes it, and the claim holds it. What a pause does not stop: a step already running
(:func:`drain_queue` waits for those), and cleanup rows (compensations and hooks run whatever
the queue).

Which name a pause matches: the routing key a worker receives the step's message on (for a
queue Queuety sends to by name, the queue's name). Steps continued inline or handed to the
same process keep the routing key of the message that started the process's work. The
numbers (:func:`queue_stats`, drain's wait) count each step under the queue Queuety sends it
to: the step's ``queue``, its workflow's, ``QUEUETY["QUEUE"]``, else ``task_default_queue``.
Both agree unless Celery's ``task_routes`` or a custom exchange sends a queue's messages under
another routing key: then pause the routing key; the numbers still show the sent name.

Held rows are released by a resume, and by the sweeper for any row whose pause is gone (a
resume killed half-way, ``queuety.runtime.paused``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from celery import current_app
from django.db.models import Count, Min, Q, QuerySet
from django.utils import timezone

from queuety import exceptions, publish, scope
from queuety.conf import settings
from queuety.core.definition import WorkflowSpec
from queuety.models import Event, QueuePause, RunStatus, StepRun, StepStatus, WorkflowRun
from queuety.runtime import paused
from queuety.store.definitions import load_spec

logger = logging.getLogger("queuety")

#: How far back the throughput looks (seconds).
THROUGHPUT_WINDOW = 300
#: Held rows released per transaction by a resume.
RELEASE_CHUNK = paused.CHUNK
#: Timeline kinds that end a step attempt for good (a step's, a branch's, an item's).
FINISHED_KINDS = ("step_completed", "step_failed", "branch_completed", "item_completed",
             "item_failed")
#: The longest queue name (the column's size).
MAX_NAME = 255


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One queue's state and numbers (:func:`queue_stats`)."""

    name: str
    paused: bool
    paused_at: datetime | None
    paused_by: str
    reason: str
    waiting: int
    """Steps due and not started: pending (their message sent) or throttled (held by a
    pause, or waiting for their concurrency group or cost budget)."""
    running: int
    """Steps claimed by a worker (processing)."""
    oldest_wait: float | None
    """Seconds the longest-waiting step has been due (None: none waits)."""
    finished: int
    """Steps that completed or failed in the last :data:`THROUGHPUT_WINDOW` seconds."""
    throughput: float
    """``finished`` per minute over that window."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``paused_at`` as ISO 8601)."""
        data = asdict(self)
        data["paused_at"] = self.paused_at.isoformat() if self.paused_at else None
        return data


def queue_of(spec: WorkflowSpec, index: int, kind: str = "step") -> str:
    """The queue of step ``index`` of ``spec`` (a cleanup row's: its workflow's queue)."""
    return publish.queue_name(spec.queue_of(index) if kind == "step" else spec.queue)


def _checked(name: str) -> str:
    """``name`` stripped of surrounding blanks (as it is stored and matched)."""
    if not isinstance(name, str) or not name.strip() or len(name.strip()) > MAX_NAME:
        raise exceptions.QueuetyError(
            f"A queue name is a non-empty string of at most {MAX_NAME} characters "
            f"(got {name!r}); use the Celery queue name the steps are sent to.")
    return name.strip()


def may_see(user: Any) -> bool:
    """Whether ``user`` may read the queues' numbers: ``queuety.view_workflowrun``, and on a
    site with ``QUEUETY["RUN_ACCESS"]`` and no ``RUN_SCOPE`` (a per-run check no count can
    apply), a superuser. The API and the admin ask this."""
    if not user.has_perm("queuety.view_workflowrun"):
        return False
    return scope.is_scoped() or settings.RUN_ACCESS is None or bool(user.is_superuser)


def may_act(user: Any) -> bool:
    """Whether ``user`` may pause or resume a queue: ``queuety.change_workflowrun``, and on a
    site with ``QUEUETY["RUN_SCOPE"]`` or ``RUN_ACCESS`` a superuser (a pause holds every
    tenant's steps). The API and the admin ask this."""
    if not user.has_perm("queuety.change_workflowrun"):
        return False
    tenanted = scope.is_scoped() or settings.RUN_ACCESS is not None
    return not tenanted or bool(user.is_superuser)


def visible_runs(user: Any) -> QuerySet[WorkflowRun] | None:
    """The runs whose steps ``user``'s numbers count (None: all, on a site with no
    ``RUN_SCOPE``)."""
    return scope.scoped_runs(user, WorkflowRun.objects.all()) if scope.is_scoped() else None


def known_queues() -> set[str]:
    """The queue names this site knows: Celery's ``task_queues`` and default queue,
    ``QUEUETY["QUEUE"]`` and the cost budgets' queues, the paused ones, and those of steps
    waiting, running or finished lately."""
    names = {str(queue.name) if hasattr(queue, "name") else str(queue)
             for queue in (current_app.conf.task_queues or ())}
    names |= {publish.queue_name(None), *settings.QUEUE_COST_BUDGETS}
    return names | {item.name for item in queue_stats()}


def unknown_warning(name: str) -> str:
    """A warning when no worker setting or step names queue ``name`` (a typo?), else ''."""
    name = _checked(name)
    if name in known_queues():
        return ""
    return (f"No step, paused queue or Celery setting (task_queues, task_default_queue, "
            f"QUEUETY['QUEUE']) names queue {name!r}: check the name, a pause of it holds "
            "only steps whose messages arrive under that routing key.")


def pause_queue(name: str, *, actor: str = "", reason: str = "") -> QueueStats:
    """Pause queue ``name``: from now on no step of it starts (see the module's text); the
    steps reaching a worker wait throttled until :func:`resume_queue`. Safe to repeat: a
    paused queue keeps its first pause's time, actor and reason. Returns its numbers.

    Raises:
        QueuetyError: ``name`` is not a queue name.
    """
    name = _checked(name)
    _, created = QueuePause.objects.get_or_create(queue=name, defaults={
        "paused_at": timezone.now(), "paused_by": actor[:255], "reason": reason})
    if created:
        logger.info("Queue %r paused by %s%s.", name, actor or "an unnamed actor",
                    f" ({reason})" if reason else "")
    return queue_stats([name])[0]


def resume_queue(name: str, *, actor: str = "") -> int:
    """Resume queue ``name``: delete its pause and publish the steps it held (due now; each
    passes its resource gate as usual). Safe to repeat; a queue that was not paused
    releases nothing. Returns how many held steps it released. ``actor`` is for the log.

    The pause is deleted first (new messages start at once), then the held rows are released
    in chunks (``queuety.runtime.paused``); rows it leaves (the request killed, a row whose
    message cannot be built) the sweeper releases, the pause being gone."""
    name = _checked(name)
    deleted, _ = QueuePause.objects.filter(queue=name).delete()
    done = paused.release(name)
    if deleted or done.released:
        logger.info("Queue %r resumed by %s: %d held step(s) released%s.", name,
                    actor or "an unnamed actor", done.released,
                    f", {done.skipped} left held (see the errors above)" if done.skipped else "")
    return done.released


def paused_queues() -> list[QueuePause]:
    """The paused queues, by name."""
    return list(QueuePause.objects.order_by("queue"))


def drain_queue(name: str, *, timeout: float | None = None, poll: float = 0.5,
                actor: str = "") -> bool:
    """Pause queue ``name`` (no step of it starts any more) and wait until its running steps
    end. Returns True when none runs, False when ``timeout`` seconds passed first. The queue
    stays paused either way: :func:`resume_queue` restarts it. Each poll counts only the
    running steps (:func:`running`)."""
    name = pause_queue(name, actor=actor, reason="drain").name
    give_up = None if timeout is None else time.monotonic() + timeout
    while running(name):
        if give_up is not None and time.monotonic() >= give_up:
            return False
        time.sleep(poll)
    return True


def running(name: str) -> int:
    """How many steps of queue ``name`` a worker is running (one query of the processing
    rows' partial index)."""
    tally, now = _Tally(), timezone.now()
    for row in _grouped(StepRun.objects.filter(status=StepStatus.PROCESSING)):
        tally.add(StepStatus.PROCESSING, row, now)
    return int(tally.numbers.get(name, {}).get("running", 0))


def _grouped(steps: QuerySet[StepRun]) -> Any:
    return (steps.values("run__definition_id", "step_index", "kind")
            .annotate(n=Count("pk"), oldest=Min("available_at")).order_by())


def queue_stats(names: Iterable[str] | None = None, *,
                runs: QuerySet[WorkflowRun] | None = None) -> list[QueueStats]:
    """The numbers of each queue (:class:`QueueStats`), by name: ``names``, or every queue
    that is paused, has waiting or running steps, or finished steps in the last
    :data:`THROUGHPUT_WINDOW` seconds. With ``runs``, only the steps of those runs are
    counted (a user's visible runs; ``queuety.scope``). Pending steps of runs that are not
    running (paused, waiting) are not counted: no claim would take them. A step's queue is
    its definition's (no column holds it): the grouped counts cover every queue, each
    group's name read from the cached spec, and only ``names`` are kept."""
    now = timezone.now()
    wanted_names = None if names is None else {_checked(name) for name in names}
    steps = StepRun.objects.all() if runs is None else StepRun.objects.filter(run__in=runs)
    events = Event.objects.all() if runs is None else Event.objects.filter(run__in=runs)
    tally = _Tally()
    # One query per status, each served by its partial index (queuety_step_due, _throttled,
    # _live); the queue of a row is its definition's, read from the (cached) spec.
    # As the claim: a pending task row counts only while its run is running.
    claimable = Q(run__status=RunStatus.RUNNING) | ~Q(kind="step")
    for status, where in ((StepStatus.PENDING, Q(available_at__lte=now) & claimable),
                          (StepStatus.THROTTLED, Q()), (StepStatus.PROCESSING, Q())):
        for row in _grouped(steps.filter(where, status=status)):
            tally.add(status, row, now)
    since = now - timedelta(seconds=THROUGHPUT_WINDOW)
    for row in (events.filter(created_at__gte=since, kind__in=FINISHED_KINDS)
                .values("run__definition_id", "step_index")
                .annotate(n=Count("pk")).order_by()):
        tally.count(_queue(row["run__definition_id"], row["step_index"] or 0), "finished",
                    row["n"])
    pauses = {pause.queue: pause for pause in QueuePause.objects.filter(
        **({} if wanted_names is None else {"queue__in": wanted_names}))}
    wanted = sorted(wanted_names if wanted_names is not None
                    else set(pauses) | set(tally.numbers))
    return [_stats(name, pauses.get(name), tally.numbers.get(name, {})) for name in wanted]


def _queue(definition_pk: int, index: int, kind: str = "step") -> str:
    spec = _spec(definition_pk)
    if spec is None or index >= len(spec.steps):
        return "?"
    return queue_of(spec, index, kind)


def _spec(definition_pk: int) -> WorkflowSpec | None:
    try:
        return load_spec(definition_pk)
    except Exception:  # noqa: BLE001 - an unloadable definition: its rows count under "?"
        return None


class _Tally:
    """Counts per queue while :func:`queue_stats` reads them."""

    def __init__(self) -> None:
        self.numbers: dict[str, dict[str, Any]] = {}

    def count(self, queue: str, field: str, n: int) -> None:
        numbers = self.numbers.setdefault(queue, {})
        numbers[field] = numbers.get(field, 0) + n

    def add(self, status: str, row: dict[str, Any], now: datetime) -> None:
        queue = _queue(row["run__definition_id"], row["step_index"], row["kind"])
        if status == StepStatus.PROCESSING:
            self.count(queue, "running", row["n"])
            return
        self.count(queue, "waiting", row["n"])
        wait = max((now - row["oldest"]).total_seconds(), 0.0)
        numbers = self.numbers[queue]
        numbers["oldest_wait"] = max(numbers.get("oldest_wait", 0.0), wait)


def _stats(name: str, pause: QueuePause | None, numbers: dict[str, Any]) -> QueueStats:
    finished = numbers.get("finished", 0)
    return QueueStats(
        name=name, paused=pause is not None, paused_at=pause and pause.paused_at,
        paused_by=pause.paused_by if pause else "", reason=pause.reason if pause else "",
        waiting=numbers.get("waiting", 0), running=numbers.get("running", 0),
        oldest_wait=numbers.get("oldest_wait"), finished=finished,
        throughput=round(finished / (THROUGHPUT_WINDOW / 60), 3))
