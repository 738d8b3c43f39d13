"""Queuety's system checks that need no database (queuety/checks.py), one settings case each;
the sweeper's database check is in tests/integration/test_checks_database.py."""

from __future__ import annotations

from unittest import mock

import pytest
from celery import Celery, current_app
from django.core import checks as django_checks
from django.db import connections
from django.test import override_settings

from queuety import checks

SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"


def ids(messages) -> list[str]:
    return [message.id for message in messages]


def test_every_check_is_registered():
    registered = set(django_checks.registry.registry.get_checks(include_deployment_checks=True))
    assert {checks.check_database, checks.check_celery_settings, checks.check_queuety_settings,
            checks.check_celery_app, checks.check_prepared_statements,
            checks.check_sweeper_schedule, checks.check_live_runs} <= registered
    assert "database" in checks.check_sweeper_schedule.tags
    assert "database" in checks.check_live_runs.tags


@pytest.mark.parametrize("vendor, expected", [
    ("postgresql", []), ("sqlite", ["queuety.W001"]), ("mysql", ["queuety.E001"]),
    ("oracle", ["queuety.E001"]),
])
def test_database__postgresql_passes_sqlite_warns_others_fail(vendor, expected):
    with mock.patch.object(connections["default"], "vendor", vendor):
        found = checks.check_database()
    assert ids(found) == expected
    if expected == ["queuety.E001"]:
        assert f"is {vendor}, and Queuety needs PostgreSQL" in found[0].msg
        assert "'django.db.backends.postgresql'" in found[0].hint


def test_database__the_demo_silences_the_sqlite_warning():
    from project import settings as demo

    if demo.EMBEDDED:
        assert "queuety.W001" in demo.SILENCED_SYSTEM_CHECKS


@pytest.mark.parametrize("scheduler", [
    SCHEDULER, "django_celery_beat.schedulers.DatabaseScheduler",
])
def test_beat_scheduler__django_celery_beats_passes(scheduler):
    with override_settings(CELERY_BEAT_SCHEDULER=scheduler):
        assert "queuety.E002" not in ids(checks.check_celery_settings())


@pytest.mark.parametrize("scheduler, shown", [
    (None, "CELERY_BEAT_SCHEDULER is not set"),
    ("celery.beat:PersistentScheduler", "is 'celery.beat:PersistentScheduler'"),
    ("shop.schedulers:Missing", "is 'shop.schedulers:Missing'"),
])
def test_beat_scheduler__any_other_is_an_error_naming_the_fix(scheduler, shown):
    with override_settings(CELERY_BEAT_SCHEDULER=scheduler):
        found = [m for m in checks.check_celery_settings() if m.id == "queuety.E002"]
    assert len(found) == 1 and found[0].level == django_checks.ERROR
    assert shown in found[0].msg and "never fires Queuety's schedules" in found[0].msg
    assert found[0].hint.startswith(f"Set CELERY_BEAT_SCHEDULER = {SCHEDULER!r}")


@pytest.mark.parametrize("acks_late, expected", [(True, []), (False, ["queuety.W002"]),
                                                 (None, ["queuety.W002"])])
def test_acks_late__missing_or_false_warns(acks_late, expected):
    with override_settings(CELERY_TASK_ACKS_LATE=acks_late, CELERY_BEAT_SCHEDULER=SCHEDULER):
        found = checks.check_celery_settings()
    assert ids(found) == expected
    if expected:
        assert "CELERY_TASK_ACKS_LATE = True" in found[0].hint


def test_queuety_setting__an_unknown_key_is_an_error_with_a_suggestion():
    with override_settings(QUEUETY={"STALE_AFTR": 30}):
        found = checks.check_queuety_settings()
    assert ids(found) == ["queuety.E003"]
    assert found[0].msg == "Unknown QUEUETY setting 'STALE_AFTR'. Did you mean 'STALE_AFTER'?"
    assert "docs/reference/settings.md" in found[0].hint


@pytest.mark.parametrize("queuety, problem", [
    ({"SWEEP_INTERVAL": 0}, "SWEEP_INTERVAL"),
    ({"HEARTBEAT_INTERVAL": 90.0}, "must be shorter than QUEUETY['STALE_AFTER']"),
    ({"BASE_URL": "shop.example.com"}, "QUEUETY['BASE_URL'] must be None or the site's"),
    ({"BASE_URL": "https://shop.example.com/app/"}, "sets FORCE_SCRIPT_NAME"),
    ({"BASE_URL": "https://shop.example.com/?x=1"}, "BASE_URL"),
])
def test_queuety_setting__a_value_that_cannot_work_is_an_error(queuety, problem):
    with override_settings(QUEUETY=queuety):
        found = checks.check_queuety_settings()
    assert ids(found) == ["queuety.E003"] and problem in found[0].msg


@pytest.mark.parametrize("base_url", [None, "https://shop.example.com",
                                      "http://127.0.0.1:8000/"])
def test_queuety_setting__valid_settings_pass(base_url):
    with override_settings(QUEUETY={"BASE_URL": base_url, "SWEEP_INTERVAL": 2}):
        assert checks.check_queuety_settings() == []


def _with_current(app: Celery):
    """Run the Celery app check with ``app`` as the current app, then restore the previous."""
    previous = current_app._get_current_object()
    app.set_current()
    try:
        return checks.check_celery_app()
    finally:
        previous.set_current()


def test_celery_app__configured_from_django_settings_passes():
    app = Celery("site", set_as_current=False)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    assert _with_current(app) == []
    assert checks.check_celery_app() == []  # the demo project's own app, from project/__init__


def test_celery_app__a_forgotten_import_leaves_the_default_app_and_is_an_error():
    found = _with_current(Celery("default", fixups=[], set_as_current=False))
    assert ids(found) == ["queuety.E004"]
    assert "not configured from Django's settings" in found[0].msg
    assert "from .celery import app as celery_app" in found[0].hint


def test_celery_app__an_app_without_the_celery_namespace_is_an_error():
    app = Celery("site", set_as_current=False)
    app.config_from_object("django.conf:settings")
    assert ids(_with_current(app)) == ["queuety.E004"]


def _databases(**extra):
    return {"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "shop",
                        "HOST": "127.0.0.1", **extra}}


@pytest.mark.parametrize("database, expected", [
    (_databases(PORT=5432, OPTIONS={"prepare_threshold": 5}), []),
    (_databases(PORT=6432), []),
    (_databases(PORT=6432, OPTIONS={"prepare_threshold": None}), []),
    (_databases(PORT="6432", OPTIONS={"prepare_threshold": 5}), ["queuety.W005"]),
    (_databases(PORT=6432, OPTIONS={"prepare_threshold": 0}), ["queuety.W005"]),
    (_databases(PORT=5432, DISABLE_SERVER_SIDE_CURSORS=True,
                OPTIONS={"prepare_threshold": 5}), ["queuety.W005"]),
])
def test_prepared_statements__warned_when_the_connection_looks_pooled(database, expected):
    # Django warns that overriding DATABASES does not reconnect: the check only reads it.
    with pytest.warns(UserWarning, match="Overriding setting DATABASES"):
        with override_settings(DATABASES=database):
            found = checks.check_prepared_statements()
    assert ids(found) == expected
    if expected:
        assert "DATABASES['default'] sets OPTIONS['prepare_threshold']" in found[0].msg
        assert found[0].hint.startswith("Remove OPTIONS['prepare_threshold']")


def test_sweeper_schedule__not_run_without_a_database():
    assert checks.check_sweeper_schedule(databases=None) == []


def test_live_runs__not_run_without_a_database():
    # Plain 'manage.py check' reads nothing: the unit tests have no database to read.
    assert checks.check_live_runs(databases=None) == []
    assert checks.check_live_runs(databases=["other"]) == []


def test_every_message_names_its_fix_in_full_sentences():
    with mock.patch.object(connections["default"], "vendor", "mysql"), \
            override_settings(CELERY_BEAT_SCHEDULER=None, CELERY_TASK_ACKS_LATE=False,
                              QUEUETY={"NOPE": 1}):
        found = (checks.check_database() + checks.check_celery_settings()
                 + checks.check_queuety_settings()
                 + _with_current(Celery("default", fixups=[], set_as_current=False)))
    assert len(found) == 5
    for message in found:
        assert message.msg[0].isupper() and message.msg.endswith((".", "?"))
        assert message.hint and message.hint[0].isupper() and message.hint.endswith(".")
