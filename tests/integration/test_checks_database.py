"""The database checks against the session's database: the sweeper's (queuety.W003 / W004 /
W006) and the I/O lane's connections against the server's max_connections (W007).

Each case changes the schedule inside a transaction that is rolled back, so the session
worker's beat never sees the sweeper's task missing or disabled.
"""

from __future__ import annotations

from contextlib import contextmanager
from unittest import mock

from django.core.management import call_command
from django.db import connection, transaction
from django.test import override_settings
from django_celery_beat.models import PeriodicTask

from queuety import checks
from queuety.sweeper_beat import SWEEPER_TASK_NAME
from tests.settings import QUEUETY as TEST_QUEUETY


@contextmanager
def rolled_back():
    with transaction.atomic():
        yield
        transaction.set_rollback(True)


def ids(messages) -> list[str]:
    return [message.id for message in messages]


def test_sweeper_schedule__as_migrate_wrote_it_passes():
    assert checks.check_sweeper_schedule(databases=["default"]) == []


def test_sweeper_schedule__missing_is_a_warning_whose_fix_is_migrate():
    with rolled_back():
        PeriodicTask.objects.filter(task="queuety.sweep").delete()
        found = checks.check_sweeper_schedule(databases=["default"])
    assert ids(found) == ["queuety.W003"]
    assert found[0].hint == "Run 'python manage.py migrate', which writes the sweeper's schedule."


def test_sweeper_schedule__disabled_is_a_warning():
    with rolled_back():
        PeriodicTask.objects.filter(name=SWEEPER_TASK_NAME).update(enabled=False)
        found = checks.check_sweeper_schedule(databases=["default"])
    assert ids(found) == ["queuety.W004"]
    assert f"{SWEEPER_TASK_NAME!r} that runs 'queuety.sweep' is disabled" in found[0].msg


def test_sweeper_schedule__an_interval_changed_since_migrate_is_a_warning():
    with override_settings(QUEUETY={**TEST_QUEUETY, "SWEEP_INTERVAL": 7}):
        found = checks.check_sweeper_schedule(databases=["default"])
    assert ids(found) == ["queuety.W006"] and "(7 s)" in found[0].msg


def test_sweeper_schedule__skipped_before_the_tables_exist_and_without_a_database():
    with mock.patch.object(connection.introspection, "table_names", return_value=[]):
        assert checks.check_sweeper_schedule(databases=["default"]) == []
    assert checks.check_sweeper_schedule(databases=["other"]) == []


def test_check_command__asked_for_the_database_runs_it_and_reports_nothing():
    # What embedding.md runs after migrate; without --database the check is not run at all.
    call_command("check", "--database", "default", "--fail-level", "WARNING")


def test_lane_connections__a_bound_the_server_has_room_for_passes():
    assert checks.check_lane_connections(databases=["default"]) == []


def test_lane_connections__one_lane_worker_that_could_take_every_connection_is_warned_about():
    with connection.cursor() as cursor:
        cursor.execute("SHOW max_connections")
        server_max = int(cursor.fetchone()[0])
    with override_settings(QUEUETY={**TEST_QUEUETY, "LANE_MAX_CONNECTIONS": server_max}):
        found = checks.check_lane_connections(databases=["default"])
        assert checks.check_lane_connections(databases=None) == []  # a database check
    assert ids(found) == ["queuety.W007"]
    assert f"One I/O lane worker may open {server_max} PostgreSQL connections" in found[0].msg
    assert "Silence queuety.W007 on a site that runs no lane worker" in found[0].hint
