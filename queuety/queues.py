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
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Count, Min, Q, QuerySet
from django.utils import timezone

from queuety import exceptions, publish
from queuety.core.definition import WorkflowSpec
from queuety.models import Event, QueuePause, StepRun, StepStatus, WorkflowRun
from queuety.store import pauses
from queuety.store.definitions import load_spec

#: How far back the throughput looks (seconds).
THROUGHPUT_WINDOW = 300
#: Held rows released per transaction by a resume.
RELEASE_CHUNK = 500
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
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME:
        raise exceptions.QueuetyError(
            f"A queue name is a non-empty string of at most {MAX_NAME} characters "
            f"(got {name!r}); use the Celery queue name the steps are sent to.")
    return name


def pause_queue(name: str, *, actor: str = "", reason: str = "") -> QueueStats:
    """Pause queue ``name``: from now on no step of it starts (see the module's text); the
    steps reaching a worker wait throttled until :func:`resume_queue`. Safe to repeat: a
    paused queue keeps its first pause's time, actor and reason. Returns its numbers.

    Raises:
        QueuetyError: ``name`` is not a queue name.
    """
    QueuePause.objects.get_or_create(queue=_checked(name), defaults={
        "paused_at": timezone.now(), "paused_by": actor[:255], "reason": reason})
    return queue_stats([name])[0]


def resume_queue(name: str, *, actor: str = "") -> int:
    """Resume queue ``name``: delete its pause and publish the steps it held (due now; each
    passes its resource gate as usual). Safe to repeat; a queue that was not paused
    releases nothing. Returns how many held steps it released. ``actor`` is for the log."""
    _checked(name)
    QueuePause.objects.filter(queue=name).delete()
    released = 0
    while True:
        with transaction.atomic():
            chunk = pauses.held(name, RELEASE_CHUNK)
            if not chunk:
                break
            released += pauses.release([row[0] for row in chunk], timezone.now())
            publish.publish_on_commit([
                publish.step_message(load_spec(definition_pk), pk, index, timeout)
                for pk, definition_pk, index, timeout in chunk])
    return released


def paused_queues() -> list[QueuePause]:
    """The paused queues, by name."""
    return list(QueuePause.objects.order_by("queue"))


def drain_queue(name: str, *, timeout: float | None = None, poll: float = 0.5) -> bool:
    """Pause queue ``name`` (no step of it starts any more) and wait until its running steps
    end. Returns True when none runs, False when ``timeout`` seconds passed first. The queue
    stays paused either way: :func:`resume_queue` restarts it."""
    pause_queue(name, reason="drain")
    give_up = None if timeout is None else time.monotonic() + timeout
    while queue_stats([name])[0].running:
        if give_up is not None and time.monotonic() >= give_up:
            return False
        time.sleep(poll)
    return True


def queue_stats(names: Iterable[str] | None = None, *,
                runs: QuerySet[WorkflowRun] | None = None) -> list[QueueStats]:
    """The numbers of each queue (:class:`QueueStats`), by name: ``names``, or every queue
    that is paused, has waiting or running steps, or finished steps in the last
    :data:`THROUGHPUT_WINDOW` seconds. With ``runs``, only the steps of those runs are
    counted (a user's visible runs; ``queuety.scope``)."""
    now = timezone.now()
    steps = StepRun.objects.all() if runs is None else StepRun.objects.filter(run__in=runs)
    events = Event.objects.all() if runs is None else Event.objects.filter(run__in=runs)
    tally = _Tally()
    # One query per status, each served by its partial index (queuety_step_due, _throttled,
    # _live); the queue of a row is its definition's, read from the (cached) spec.
    for status, where in ((StepStatus.PENDING, Q(available_at__lte=now)),
                          (StepStatus.THROTTLED, Q()), (StepStatus.PROCESSING, Q())):
        for row in (steps.filter(where, status=status)
                    .values("run__definition_id", "step_index", "kind")
                    .annotate(n=Count("pk"), oldest=Min("available_at"))
                    .order_by()):
            tally.add(status, row, now)
    since = now - timedelta(seconds=THROUGHPUT_WINDOW)
    for row in (events.filter(created_at__gte=since, kind__in=("step_completed", "step_failed"))
                .values("run__definition_id", "step_index")
                .annotate(n=Count("pk")).order_by()):
        tally.count(_queue(row["run__definition_id"], row["step_index"] or 0), "finished",
                    row["n"])
    paused = {pause.queue: pause for pause in QueuePause.objects.all()}
    wanted = sorted(set(names) if names is not None else set(paused) | set(tally.numbers))
    return [_stats(name, paused.get(name), tally.numbers.get(name, {})) for name in wanted]


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
