"""System checks: the settings Queuety needs, reported by ``manage.py check`` (and by
``runserver`` and ``migrate``) instead of as a run that never moves.

Registered in ``QueuetyConfig.ready()``. Each message says what is wrong; its hint says how to
fix it. docs/deploy/embedding.md, "System checks", lists them all.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections

from queuety import conf
from queuety.runtime import lane

#: The scheduler that reads django-celery-beat's tables, where ``migrate`` puts the sweeper.
DATABASE_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
#: PgBouncer's default port: a connection there most likely goes through PgBouncer.
PGBOUNCER_PORT = 6432
GUIDE = "docs/deploy/embedding.md"


@register()
def check_database(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """queuety.E001 / W001: Queuety runs on PostgreSQL.

    SQLite is a warning, not an error: it is the demo's embedded default (one machine, no
    server), where Queuety works with fewer guarantees; the demo silences the warning.
    """
    vendor = connections["default"].vendor
    if vendor == "postgresql":
        return []
    if vendor == "sqlite":
        return [Warning(
            "The default database is SQLite: Queuety's workers then take turns on one file, "
            "and the one-statement step boundary and row locks of PostgreSQL are not used.",
            hint="Use PostgreSQL (ENGINE 'django.db.backends.postgresql') for anything but a "
                 "demo on one machine; the demo project silences this warning "
                 "(SILENCED_SYSTEM_CHECKS).",
            id="queuety.W001")]
    return [Error(
        f"The default database is {vendor}, and Queuety needs PostgreSQL.",
        hint="Set DATABASES['default']['ENGINE'] to 'django.db.backends.postgresql' "
             f"({GUIDE}, step 2).",
        id="queuety.E001")]


@register()
def check_celery_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """queuety.E002 (beat's scheduler) and W002 (late acknowledgement)."""
    problems: list[CheckMessage] = []
    scheduler = getattr(settings, "CELERY_BEAT_SCHEDULER", None)
    if not _is_database_scheduler(scheduler):
        found = "not set" if scheduler is None else f"{scheduler!r}"
        problems.append(Error(
            f"CELERY_BEAT_SCHEDULER is {found}, so beat never fires Queuety's schedules "
            "(queuety.schedule()), nor the sweeper's entry that workers of a Queuety from "
            "before migration queuety.0015 need to sweep.",
            hint=f"Set CELERY_BEAT_SCHEDULER = {DATABASE_SCHEDULER!r} (schedules are rows "
                 "of django-celery-beat's tables, the sweeper's written by migrate).",
            id="queuety.E002"))
    if getattr(settings, "CELERY_TASK_ACKS_LATE", False) is not True:
        problems.append(Warning(
            "CELERY_TASK_ACKS_LATE is not True: Queuety's step task acknowledges late on its "
            "own, but a worker killed during its other tasks (waking a parent run) loses "
            "their messages, which then wait for the sweeper.",
            hint="Set CELERY_TASK_ACKS_LATE = True and CELERY_TASK_REJECT_ON_WORKER_LOST = True.",
            id="queuety.W002"))
    return problems


def _is_database_scheduler(scheduler: object) -> bool:
    if scheduler is None:
        return False
    from celery.utils.imports import symbol_by_name
    from django_celery_beat.schedulers import DatabaseScheduler

    try:
        found = symbol_by_name(scheduler) if isinstance(scheduler, str) else scheduler
    except (ImportError, AttributeError, ValueError):
        return False
    return isinstance(found, type) and issubclass(found, DatabaseScheduler)


@register()
def check_queuety_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """queuety.E003: every ``QUEUETY`` key is known and every value can work."""
    try:
        conf.settings.validate()
    except ImproperlyConfigured as error:
        return [Error(str(error), hint="Fix the QUEUETY setting: docs/reference/settings.md "
                                       "lists every key and the values it takes.",
                      id="queuety.E003")]
    return []


@register()
def check_celery_app(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """queuety.E004: this process's Celery app reads the ``CELERY_`` settings.

    Without it, dispatches go out through Celery's fallback app (its default broker, or no
    broker at all) and every run starts only when the sweeper publishes its first step.
    """
    from celery import current_app

    if getattr(current_app, "namespace", None) == "CELERY":
        return []
    return [Error(
        "The current Celery app is not configured from Django's settings (namespace "
        "'CELERY'), so runs dispatched here are not published to your workers' broker; each "
        "starts only when the sweeper publishes it, about a minute later.",
        hint="Create your project's Celery app with app.config_from_object("
             "'django.conf:settings', namespace='CELERY') in <project>/celery.py, and import "
             "it in <project>/__init__.py (from .celery import app as celery_app), as "
             f"Celery's Django guide and {GUIDE} (step 3) show.",
        id="queuety.E004")]


@register()
def check_prepared_statements(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """queuety.W005: prepared statements asked for on a connection that looks pooled.

    A connection looks pooled when it goes to PgBouncer's default port (6432) or sets
    ``DISABLE_SERVER_SIDE_CURSORS`` (what Django's documentation asks of a site behind a
    transaction-mode pooler).
    """
    problems: list[CheckMessage] = []
    databases: dict[str, dict[str, Any]] = settings.DATABASES
    for alias, database in databases.items():
        options = database.get("OPTIONS") or {}
        if options.get("prepare_threshold") is None:
            continue
        if str(database.get("PORT") or "") == str(PGBOUNCER_PORT):
            why = f"its PORT is {PGBOUNCER_PORT}, PgBouncer's"
        elif database.get("DISABLE_SERVER_SIDE_CURSORS") is True:
            why = "it sets DISABLE_SERVER_SIDE_CURSORS, as for a transaction-mode pooler"
        else:
            continue
        problems.append(Warning(
            f"DATABASES[{alias!r}] sets OPTIONS['prepare_threshold'] and looks like a "
            f"connection through a pooler ({why}): PgBouncer in transaction mode before 1.21, "
            "or without max_prepared_statements, fails statements that were prepared on "
            "another server connection.",
            hint="Remove OPTIONS['prepare_threshold'] unless the pooler keeps prepared "
                 "statements (PgBouncer 1.21 or later with max_prepared_statements set); "
                 "docs/deploy/running-workers.md, 'Behind PgBouncer', says more. Silence "
                 "queuety.W005 once it does.",
            id="queuety.W005"))
    return problems


@register(Tags.database)
def check_sweeper_schedule(app_configs: Any = None, databases: Any = None,
                           **kwargs: Any) -> list[CheckMessage]:
    """queuety.W003 / W004 / W006: the sweeper's periodic task is there, enabled and in step
    (what workers from before the in-worker sweep, migration 0015, rely on; current workers
    sweep without it, ``queuety.runtime.sweep_tick``).

    A database check, so it runs only when asked (``check --database default``) and on
    ``migrate``. Warnings, not errors: ``migrate`` is their fix, and errors would stop it.
    Skipped until Queuety's and django-celery-beat's tables exist (``migrate`` makes the task).
    """
    if not databases or "default" not in databases:
        return []
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    from queuety.models import WorkflowRun
    from queuety.sweeper_beat import SWEEPER_TASK_NAME

    connection = connections["default"]
    try:
        tables = set(connection.introspection.table_names())
        if not {PeriodicTask._meta.db_table, WorkflowRun._meta.db_table} <= tables:
            return []
        tasks = list(PeriodicTask.objects.using("default").filter(task="queuety.sweep")
                     .select_related("interval"))
    except DatabaseError:
        return []  # reported by Django's own checks, or by the command that needs the database
    fix = "Run 'python manage.py migrate', which writes the sweeper's schedule."
    if not tasks:
        return [Warning(
            "No django-celery-beat periodic task runs 'queuety.sweep'. Workers sweep by "
            "themselves, but those of a Queuety from before migration queuety.0015 sweep only "
            "when beat asks: with only such workers, lost steps are not run again and long "
            "delays never end.", hint=fix, id="queuety.W003")]
    enabled = [task for task in tasks if task.enabled]
    if not enabled:
        return [Warning(
            f"The periodic task {tasks[0].name!r} that runs 'queuety.sweep' is disabled: "
            "workers sweep by themselves, but those of a Queuety from before migration "
            "queuety.0015 never do.",
            hint="Run 'python manage.py migrate', which enables it again (or enable it in "
                 "the admin, under Periodic tasks).", id="queuety.W004")]
    every, queue = conf.settings.SWEEP_INTERVAL, conf.settings.QUEUE
    in_step = [task for task in enabled if task.interval is not None
               and task.interval.period == IntervalSchedule.SECONDS
               and task.interval.every == every and (task.queue or None) == queue]
    if not in_step and any(task.name == SWEEPER_TASK_NAME for task in enabled):
        return [Warning(
            f"The sweeper's periodic task does not match QUEUETY['SWEEP_INTERVAL'] ({every} s) "
            f"and QUEUETY['QUEUE'] ({queue!r}), which changed since the last migrate.",
            hint=fix, id="queuety.W006")]
    return []


@register(Tags.database)
def check_lane_connections(app_configs: Any = None, databases: Any = None,
                           **kwargs: Any) -> list[CheckMessage]:
    """queuety.W007: one I/O lane worker could take every connection of the PostgreSQL server.

    A database check (``check --database default``, and ``migrate``): it reads the server's
    ``max_connections``. A warning: a site that runs no lane worker may silence it.
    """
    if not databases or "default" not in databases:
        return []
    connection = connections["default"]
    if connection.vendor != "postgresql":
        return []
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT current_setting('max_connections')::int, "
                "current_setting('superuser_reserved_connections')::int "
                "+ coalesce(current_setting('reserved_connections', true), '0')::int")
            server_max, reserved = cursor.fetchone()
    except DatabaseError:
        return []  # reported by Django's own checks, or by the command that needs the database
    advice = lane.server_advice(settings.DATABASES, conf.settings.LANE_MAX_CONNECTIONS,
                                server_max, reserved)
    if advice is None:
        return []
    return [Warning(advice, hint=(
        "Lower DATABASES['default']['OPTIONS']['pool']['max_size'] (with the pool) or "
        "QUEUETY['LANE_MAX_CONNECTIONS'] (without it), or raise the server's max_connections: "
        "every lane worker's connections and every web process's together must stay under it "
        "(docs/deploy/io-lane.md, 'Connections'). Silence queuety.W007 on a site that runs no "
        "lane worker."), id="queuety.W007")]


#: What to do about a live run that would fail (queuety.E005).
_DEPLOY_HINT = (
    "Put the handler back where the definition names it, or alias the old path to the new "
    "one (QUEUETY['HANDLER_ALIASES'] or queuety.alias()); 'manage.py queuety deploy-check' "
    "lists every definition with live runs, its runs and every path that fails.")


@register(Tags.database)
def check_live_runs(app_configs: Any = None, databases: Any = None,
                    **kwargs: Any) -> list[CheckMessage]:
    """queuety.E005 / E006: every live run gets past the code at hand (the deploy check).

    A database check, so it runs only when asked (``check --database default``, which then
    exits non-zero: a CI step or a release phase gates a deploy on it) and on ``migrate``,
    which it then stops too (``migrate --skip-checks`` goes ahead). Skipped until Queuety's
    tables exist.
    """
    if not databases or "default" not in databases:
        return []
    from queuety import deploy_check
    from queuety.models import WorkflowRun

    try:
        if WorkflowRun._meta.db_table not in connections["default"].introspection.table_names():
            return []
        report = deploy_check.deploy_check()
    except DatabaseError:
        return []  # reported by Django's own checks, or by the command that needs the database
    problems: list[CheckMessage] = []
    for found in report.definitions:
        live = sum(found.live.values())
        label = f"Workflow {found.name!r}" + (f" {found.version}" if found.version else "")
        problems += [Error(
            f"{label} (definition {found.hash[:12]}) has {live} live "
            f"run{'s' if live != 1 else ''}, the oldest #{found.oldest_run_id}, that would "
            f"fail: {problem}", hint=_DEPLOY_HINT, id="queuety.E005")
            for problem in found.check.failures]
    problems += [Error(alias.problem, hint="Point the alias to a path that imports in this "
                                           "code, or remove it.", id="queuety.E006")
                 for alias in report.aliases if alias.problem is not None]
    return problems
