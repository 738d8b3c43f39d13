"""Schedules: start a registered workflow on a cron expression or an interval.

A schedule is a django-celery-beat ``PeriodicTask`` row (named ``queuety: <name>``, task
``queuety.fire_schedule``) whose ``kwargs`` hold the workflow, its payload and the overlap
policy: it is listed, edited, disabled and deleted in the beat admin like any periodic task.

Each fire starts its run with an idempotency key made of the schedule's name and the fire's
nominal time (the latest cron tick, or interval slot, at or before the moment beat sent it):
a beat restart that fires again, or two beats, never start two runs for one tick, and a fire
that waited in the broker past the next tick still starts its own tick's run. Beat's message
carries the moment it was sent (the ``queuety_sent_at`` header, :func:`stamp_sent_at`).

A cron tick is a wall-clock time of the schedule's zone, run once even on the days daylight
saving skips or repeats it (:func:`latest_tick` says how those are keyed); an interval slot
is counted in UTC and does not move at all.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celery.schedules import crontab
from django.db import transaction
from django.utils import timezone as django_timezone

from queuety import exceptions, publish, registry
from queuety.conf import settings
from queuety.core import budget as budgets
from queuety.core.definition import check_payload
from queuety.core.status import FINISHED, UNFINISHED
from queuety.models import DispatchKey, WorkflowRun

logger = logging.getLogger("queuety")

#: The Celery task a schedule's PeriodicTask runs (a stable message contract).
FIRE_TASK = "queuety.fire_schedule"
#: Prefix of a schedule's PeriodicTask name, so it sorts apart from a site's own tasks.
TASK_PREFIX = "queuety: "
OVERLAP_POLICIES = ("allow", "skip", "buffer")
MAX_NAME = 150  # the PeriodicTask name (200) and the idempotency key (255) must hold it


@dataclass(frozen=True, slots=True)
class Schedule:
    """A schedule, as ``manage.py queuety schedule list`` shows it."""

    name: str
    workflow: str
    cron: str | None
    every: int | None
    """Seconds between fires, for an interval schedule."""
    timezone: str | None
    """The cron expression's time zone (django-celery-beat's ``CrontabSchedule.timezone``)."""
    payload: dict[str, Any]
    overlap: str
    enabled: bool
    last_run_at: datetime | None

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape the CLI prints."""
        return {"name": self.name, "workflow": self.workflow, "cron": self.cron,
                "every": self.every, "timezone": self.timezone, "payload": self.payload,
                "overlap": self.overlap, "enabled": self.enabled,
                "last_run_at": self.last_run_at.isoformat() if self.last_run_at else None}


@dataclass(frozen=True, slots=True)
class Fire:
    """What one fire of a schedule did."""

    outcome: str
    """``started``, ``already_started`` (this tick's run exists), ``skipped`` (``skip``
    and a run of the schedule is live), ``buffered`` (``buffer``: waits for ``waiting_for``)."""
    run_id: int | None = None
    waiting_for: int | None = None
    key: str | None = None


def parse_cron(expression: str, tz: str | None = None) -> crontab:
    """Return the Celery ``crontab`` of a five-field cron expression
    (``minute hour day-of-month month day-of-week``), checking the time zone ``tz`` it is
    read in, if given.

    Raises:
        InvalidSchedule: not five fields, a field Celery cannot read, or an unknown zone.
    """
    fields = expression.split() if isinstance(expression, str) else []
    if len(fields) != 5:
        raise exceptions.InvalidSchedule(
            f"The cron expression {expression!r} must have five fields (minute hour "
            "day-of-month month day-of-week), e.g. '0 3 * * *' for 03:00 every day.")
    minute, hour, day_of_month, month_of_year, day_of_week = fields
    if tz:
        _zone(tz)
    try:
        return crontab(minute=minute, hour=hour, day_of_month=day_of_month,
                       month_of_year=month_of_year, day_of_week=day_of_week)
    except (ValueError, TypeError) as error:
        raise exceptions.InvalidSchedule(
            f"The cron expression {expression!r} is not valid: "
            f"{str(error).rstrip('.')}.") from None


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise exceptions.InvalidSchedule(
            f"{name!r} is not a time zone name (use an IANA name such as 'Europe/Paris' or "
            "'UTC').") from None


def latest_tick(cron: crontab, now: datetime, zone: ZoneInfo) -> datetime:
    """The latest tick of ``cron`` at or before ``now`` (to the minute), in UTC.

    A tick is a wall-clock time in ``zone`` that ``cron`` matches, at the first instant the
    clocks show it. Across daylight saving:

    * a time the clocks skip (02:30 when 02:00 becomes 03:00) is the first instant after the
      jump, 03:00 (Celery's beat sends it at 03:30, reading 02:30 with the offset before the
      jump; the fire is keyed 03:00 all the same);
    * a time the clocks show twice (02:30 when 03:00 becomes 02:00) is one tick, the first:
      a fire in the repeated hour finds that tick's key and starts nothing.

    So the tick never lies after ``now``, never goes back as ``now`` advances, and one
    wall-clock tick is one key. Days are matched as Celery's crontab matches them: day of
    month AND day of week.
    """
    instant = now.astimezone(dt_timezone.utc).replace(second=0, microsecond=0)
    local = instant.astimezone(zone)
    # The expanded sets of the parsed expression (celery-types does not declare them).
    months, days, weekdays, hours, minutes = (
        set(getattr(cron, field)) for field in
        ("month_of_year", "day_of_month", "day_of_week", "hour", "minute"))
    for offset in range(366 * 8 + 1):  # a 29 February rule needs up to eight years
        day: date = local.date() - timedelta(days=offset)
        if day.month in months and day.day in days and (day.isoweekday() % 7) in weekdays:
            tick = _latest_on(day, sorted(hours, reverse=True), minutes, zone, instant)
            if tick is not None:
                return tick
    raise exceptions.InvalidSchedule(f"The cron expression {cron!r} never matches a date.")


#: How far (in hours) a daylight saving jump moves the clocks: two at most (Antarctica/Troll),
#: one nearly everywhere.
_MAX_JUMP_HOURS = 2


def _latest_on(day: date, hours: list[int], minutes: set[int], zone: ZoneInfo,
               instant: datetime) -> datetime | None:
    """The latest tick on ``day`` (``hours`` descending) at or before ``instant``, or None.

    Compared as instants, not as wall-clock times, which would take a repeated 02:30 for a
    time still to come; the hours just below the first one with a tick are looked at too, as
    a jump can put a later wall-clock time before an earlier one.
    """
    best: datetime | None = None
    first_hour = 0
    jump = timedelta(hours=_MAX_JUMP_HOURS)
    for hour in hours:
        if best is not None and hour < first_hour - _MAX_JUMP_HOURS:
            break
        if first_instant(datetime(day.year, day.month, day.day, hour, tzinfo=zone)) - \
                jump > instant:
            continue  # every minute of this hour is still to come (one look, not sixty)
        for minute in minutes:
            moment = first_instant(datetime(day.year, day.month, day.day, hour, minute,
                                            tzinfo=zone))
            if moment <= instant and (best is None or moment > best):
                first_hour = hour if best is None else first_hour
                best = moment
    return best


def first_instant(wall: datetime) -> datetime:
    """The first instant (in UTC) at which the clocks of ``wall``'s zone show ``wall`` or a
    later time: ``wall`` itself (its first occurrence, if the clocks show it twice), or, for a
    time they skip, the instant they jump."""
    earliest = wall.replace(fold=0).astimezone(dt_timezone.utc)
    if earliest.astimezone(wall.tzinfo).replace(tzinfo=None) == wall.replace(tzinfo=None,
                                                                            fold=0):
        return earliest
    # Skipped: the jump lies between the time read with the offset after it and with the
    # offset before it. Found by halving, to the minute (zones jump on whole minutes).
    low, high = wall.replace(fold=1).astimezone(dt_timezone.utc), earliest
    minute = timedelta(minutes=1)
    while high - low > minute:
        middle = low + (high - low) // minute // 2 * minute
        if middle.astimezone(wall.tzinfo).replace(tzinfo=None) >= wall.replace(tzinfo=None):
            high = middle
        else:
            low = middle
    return high


def interval_slot(every: int, now: datetime) -> datetime:
    """The start of the ``every``-second slot (counted from the Unix epoch) holding ``now``."""
    seconds = int(now.timestamp()) // every * every
    return datetime.fromtimestamp(seconds, tz=dt_timezone.utc)


_UNITS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600,
          "hour": 3600, "d": 86400, "day": 86400, "w": 604800, "week": 604800}


def parse_every(text: str) -> int:
    """Seconds in an interval such as ``"90"``, ``"30 minutes"``, ``"1 hour"``, ``"2d"``.

    Raises:
        InvalidSchedule: not a whole, positive number of seconds, minutes, hours, days or
            weeks.
    """
    cleaned = str(text).strip().lower()
    number = cleaned.rstrip("abcdefghijklmnopqrstuvwxyz ").strip()
    unit = cleaned[len(number):].strip()
    unit = unit[:-1] if unit.endswith("s") and unit[:-1] in _UNITS else unit
    if not number.isdigit() or int(number) < 1 or (unit and unit not in _UNITS):
        raise exceptions.InvalidSchedule(
            f"The interval {text!r} is not one Queuety reads; write a whole number of seconds "
            "(e.g. '90') or of minutes, hours, days or weeks ('30 minutes', '1 hour', '2d').")
    return int(number) * _UNITS.get(unit or "s", 1)


def schedule(name: str, *, workflow: str, cron: str | None = None,
             every: timedelta | int | None = None, payload: dict[str, Any] | None = None,
             overlap: str = "allow", timezone: str | None = None,
             enabled: bool = True) -> Schedule:
    """Create or update schedule ``name``: start ``workflow`` with ``payload`` on ``cron``
    (five fields, in ``timezone``, else django-celery-beat's default, ``CELERY_TIMEZONE``
    or UTC) or ``every`` (a ``timedelta`` or seconds, at least one whole second).

    ``overlap`` says what a fire does while a run of this schedule is still live: ``allow``
    starts another, ``skip`` starts nothing, ``buffer`` starts one as soon as it finishes.

    Raises:
        InvalidSchedule: a bad name, both or neither of ``cron`` and ``every``, a bad cron
            expression, interval or time zone, or an unknown overlap policy.
        UnknownWorkflow: ``workflow`` is not registered.
        InvalidPayload, BudgetExceeded: the payload is not a JSON object, or is over the
            workflow's ``max_state_bytes``. Nothing is written on any error.
    """
    from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask

    if not isinstance(name, str) or not name.strip() or len(name.strip()) > MAX_NAME:
        raise exceptions.InvalidSchedule(
            f"A schedule needs a non-blank name of at most {MAX_NAME} characters "
            f"(got {name!r:.80}).")
    name = name.strip()
    if (cron is None) == (every is None):
        raise exceptions.InvalidSchedule(
            f"Schedule {name!r} needs exactly one of cron='0 3 * * *' or "
            "every=timedelta(...).")
    if overlap not in OVERLAP_POLICIES:
        raise exceptions.InvalidSchedule(
            f"Schedule {name!r} has the unknown overlap policy {overlap!r}; use 'allow', "
            "'skip' or 'buffer'.")
    spec = registry.get(workflow).spec
    state = check_payload(workflow, payload)
    limit = spec.budget.max_state_bytes
    if limit is not None and (size := budgets.state_bytes(state)) > limit:
        raise exceptions.BudgetExceeded(
            "max_state_bytes", limit, size, None, workflow,
            message=f"The payload of schedule {name!r} is {size} bytes, over workflow "
                    f"{workflow!r}'s max_state_bytes budget of {limit}; nothing was saved.")
    seconds: int | None = None
    if every is not None:
        seconds = _seconds(name, every)
    else:
        assert cron is not None
        parse_cron(cron, timezone)
    kwargs = {"schedule": name, "workflow": workflow, "payload": state, "overlap": overlap}
    with transaction.atomic():
        defaults: dict[str, Any] = {
            "task": FIRE_TASK, "kwargs": json.dumps(kwargs), "enabled": enabled,
            "queue": settings.QUEUE, "interval": None, "crontab": None,
            "description": f"Starts workflow {workflow!r} (Queuety schedule {name!r}).",
        }
        if seconds is not None:
            defaults["interval"] = IntervalSchedule.objects.filter(
                every=seconds, period=IntervalSchedule.SECONDS).order_by("pk").first() or \
                IntervalSchedule.objects.create(every=seconds, period=IntervalSchedule.SECONDS)
        else:
            assert cron is not None
            minute, hour, day_of_month, month_of_year, day_of_week = cron.split()
            # The zone always takes part: a row of the same fields in another zone (the beat
            # admin's, say) is another schedule. Without one, beat's own default zone.
            zone = timezone or CrontabSchedule._meta.get_field("timezone").get_default()
            fields = {"minute": minute, "hour": hour, "day_of_month": day_of_month,
                      "month_of_year": month_of_year, "day_of_week": day_of_week,
                      "timezone": zone}
            defaults["crontab"] = CrontabSchedule.objects.filter(**fields).order_by(
                "pk").first() or CrontabSchedule.objects.create(**fields)
        task, _ = PeriodicTask.objects.update_or_create(name=TASK_PREFIX + name,
                                                        defaults=defaults)
    logger.info("Schedule %r of workflow %r saved (PeriodicTask id=%s).", name, workflow,
                task.pk)
    return _schedule_of(task)


def _seconds(name: str, every: timedelta | int) -> int:
    value = every.total_seconds() if isinstance(every, timedelta) else every
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 1 or \
            value != int(value):
        raise exceptions.InvalidSchedule(
            f"Schedule {name!r}: every must be a whole number of seconds, at least 1 "
            f"(got {every!r}).")
    return int(value)


def schedules() -> list[Schedule]:
    """Every schedule, by name."""
    from django_celery_beat.models import PeriodicTask

    return [_schedule_of(task) for task in PeriodicTask.objects.filter(task=FIRE_TASK)
            .select_related("crontab", "interval").order_by("name")]


def get(name: str) -> Schedule:
    """Schedule ``name``.

    Raises:
        InvalidSchedule: there is no such schedule (the error lists the schedules there are).
    """
    return _schedule_of(_task(name))


def remove(name: str) -> None:
    """Delete schedule ``name`` (its runs stay).

    Raises:
        InvalidSchedule: there is no such schedule.
    """
    _task(name).delete()


def _task(name: str) -> Any:
    from django_celery_beat.models import PeriodicTask

    task = (PeriodicTask.objects.filter(task=FIRE_TASK, name=TASK_PREFIX + str(name))
            .select_related("crontab", "interval").first())
    if task is None:
        known = ", ".join(repr(each.name) for each in schedules()) or "none"
        raise exceptions.InvalidSchedule(
            f"There is no schedule {name!r}; the schedules are {known}. Add one with "
            "queuety.schedule() or manage.py queuety schedule add.")
    return task


def _schedule_of(task: Any) -> Schedule:
    try:
        kwargs = json.loads(task.kwargs or "{}")
    except ValueError:
        kwargs = {}
    cron = None if task.crontab is None else " ".join(
        (task.crontab.minute, task.crontab.hour, task.crontab.day_of_month,
         task.crontab.month_of_year, task.crontab.day_of_week))
    every = None
    if task.interval is not None:
        every = int(timedelta(**{task.interval.period: task.interval.every}).total_seconds())
    return Schedule(
        name=task.name.removeprefix(TASK_PREFIX), workflow=str(kwargs.get("workflow", "")),
        cron=cron, every=every,
        timezone=None if task.crontab is None else str(task.crontab.timezone),
        payload=kwargs.get("payload") or {}, overlap=str(kwargs.get("overlap", "allow")),
        enabled=task.enabled, last_run_at=task.last_run_at)


def key_prefix(name: str) -> str:
    """The prefix of the idempotency keys of the runs schedule ``name`` started."""
    return f"queuety-schedule:{name}:"


def fire(name: str, *, now: datetime | None = None, after: int | None = None,
         manual: bool = False) -> Fire:
    """Fire schedule ``name`` once, as beat does at its tick (``queuety.fire_schedule``).

    ``after`` is the live run a buffered fire waits for; ``manual`` (``schedule run``) keys the
    run by this very moment instead of the tick, so it starts one even if the tick's exists.

    Raises:
        InvalidSchedule: no such schedule, or its row (edited in the beat admin) is invalid.
        UnknownWorkflow, InvalidPayload, BudgetExceeded: from starting the run.
    """
    found = get(name)
    now = now or django_timezone.now()
    if found.overlap not in OVERLAP_POLICIES:
        raise exceptions.InvalidSchedule(
            f"Schedule {name!r} has the unknown overlap policy {found.overlap!r} (edited in "
            "the beat admin?); use 'allow', 'skip' or 'buffer'.")
    prefix = key_prefix(name)
    if after is not None:
        if _is_live(after):
            return Fire("buffered", waiting_for=after)
        key = f"{prefix}after:{after}"
    else:
        if manual:
            moment = now
        elif found.cron is not None:
            moment = latest_tick(parse_cron(found.cron), now, _zone(found.timezone or "UTC"))
        else:
            assert found.every is not None
            moment = interval_slot(found.every, now)
        key = prefix + moment.astimezone(dt_timezone.utc).isoformat()
        live = None if found.overlap == "allow" else _live_run(name, key)
        if live is not None and found.overlap == "skip":
            logger.info("Schedule %r skipped its fire %s: run id=%s is still live.", name, key,
                        live)
            return Fire("skipped", waiting_for=live, key=key)
        if live is not None:
            logger.info("Schedule %r buffered its fire %s until run id=%s finishes.", name,
                        key, live)
            return Fire("buffered", waiting_for=live, key=key)
    run_id, reused = registry.start_run(found.workflow, found.payload, idempotency_key=key)
    if not reused:
        logger.info("Schedule %r started run id=%s of workflow %r (key %s).", name, run_id,
                    found.workflow, key)
    return Fire("already_started" if reused else "started", run_id=run_id, key=key)


#: The header of a ``queuety.fire_schedule`` message that says when it was sent (epoch seconds).
SENT_AT_HEADER = "queuety_sent_at"


def stamp_sent_at(sender: Any = None, headers: dict[str, Any] | None = None,
                  **_: Any) -> None:
    """Celery's ``before_task_publish`` receiver (for ``queuety.fire_schedule``): put the
    moment the message is sent in its headers, so the fire is keyed by the tick beat sent it
    for, however long it then waited in the broker."""
    if headers is not None and headers.get("task", sender) == FIRE_TASK:
        headers.setdefault(SENT_AT_HEADER, django_timezone.now().timestamp())


def sent_at(request: Any) -> datetime | None:
    """When beat sent the fire ``request`` (a Celery task request), from its header; None
    when it has none (a message from before the header) or the time is not a number. A sender
    whose clock runs ahead is not believed past the present."""
    # A message header is a request attribute.
    return moment_of(getattr(request, SENT_AT_HEADER, None))


def moment_of(stamp: Any) -> datetime | None:
    """The moment epoch seconds ``stamp`` names, not past the present; None when ``stamp``
    is not a number."""
    if isinstance(stamp, bool) or not isinstance(stamp, int | float):
        return None
    return min(datetime.fromtimestamp(stamp, tz=dt_timezone.utc), django_timezone.now())


def fire_and_follow(name: str, *, after: int | None = None, manual: bool = False,
                    now: datetime | None = None) -> Fire:
    """:func:`fire`, and for a buffered fire, send ``queuety.fire_schedule`` again in
    ``SWEEP_INTERVAL`` seconds to look once more (what the task and ``schedule run`` do).
    ``now``: the moment the fire is for (when beat sent it), else the present."""
    fired = fire(name, now=now, after=after, manual=manual)
    if fired.outcome == "buffered" and (after is not None or _first_behind(
            name, fired.waiting_for)):
        # Lost with the broker: the next tick after the live run finishes starts the run.
        publish.send_later(FIRE_TASK, {"schedule": name, "after": fired.waiting_for},
                           settings.SWEEP_INTERVAL)
    return fired


def _first_behind(name: str, live: int | None) -> bool:
    """Whether this is the first fire to buffer behind run ``live``: only that one starts
    the follow-up that looks again every ``SWEEP_INTERVAL``, so a per-minute schedule behind a
    run that waits a day keeps one follow-up, not one per tick. (A used key row marks it:
    ``queuety-schedule:<name>:behind:<run id>``.)"""
    if live is None:
        return False
    _, created = DispatchKey.objects.get_or_create(
        key=f"{key_prefix(name)}behind:{live}",
        defaults={"run_id": live, "payload_hash": "", "definition_hash": ""})
    return created


def _live_run(name: str, key: str) -> int | None:
    """The newest live run this schedule started, other than the one keyed ``key``."""
    run = (WorkflowRun.objects.filter(status__in=UNFINISHED,
                                      idempotency_key__startswith=key_prefix(name))
           .exclude(idempotency_key=key).order_by("-id").values_list("pk", flat=True).first())
    return run


def _is_live(run_id: int) -> bool:
    return WorkflowRun.objects.filter(pk=run_id).exclude(status__in=FINISHED).exists()
