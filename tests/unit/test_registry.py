"""The registry and the schedules' time arithmetic: pure logic, no database."""

from __future__ import annotations

from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import pytest

import queuety
from queuety import registry, schedules
from tests import workflows as steps

UTC = timezone.utc


@pytest.fixture
def scratch():
    """Names registered by a test are forgotten after it."""
    names: list[str] = []
    yield names
    for name in names:
        registry.unregister(name)


def test_register__a_builder_and_a_decorated_function_are_listed_with_version_and_hash(scratch):
    scratch += ["unit_plain", "unit_decorated"]
    queuety.register("unit_plain", queuety.workflow("unit_plain").then(steps.step_a))

    @queuety.register("unit_decorated")
    def decorated():
        """Two steps.

        Not part of the description."""
        return queuety.workflow("unit_decorated").version("7").then(steps.step_a) \
            .then(steps.step_b)

    listed = {entry.name: entry for entry in queuety.registered()}
    assert decorated().build().definition_hash == listed["unit_decorated"].definition_hash
    assert listed["unit_decorated"].to_dict() == {
        "name": "unit_decorated", "version": "7",
        "definition_hash": decorated().build().definition_hash,
        "steps": ["step_a", "step_b"], "description": "Two steps."}
    assert listed["unit_plain"].version is None and listed["unit_plain"].steps == ("step_a",)
    assert callable(decorated)  # the decorator hands the function back


def test_register__the_same_definition_twice_is_harmless_another_one_is_refused(scratch):
    scratch.append("unit_twice")
    queuety.register("unit_twice", queuety.workflow("unit_twice").then(steps.step_a))
    queuety.register("unit_twice", queuety.workflow("unit_twice").then(steps.step_a))
    with pytest.raises(queuety.WorkflowDefinitionError, match="already registered"):
        queuety.register("unit_twice", queuety.workflow("unit_twice").then(steps.step_b))
    assert registry.get("unit_twice").steps == ("step_a",)


def test_register__refuses_a_builder_of_another_name_and_what_is_not_a_builder():
    with pytest.raises(queuety.WorkflowDefinitionError, match="builder of workflow 'other'"):
        queuety.register("unit_named", queuety.workflow("other").then(steps.step_a))
    with pytest.raises(queuety.WorkflowDefinitionError, match="got int"):
        queuety.register("unit_named", lambda: 42)
    assert "unit_named" not in {entry.name for entry in queuety.registered()}


def test_get__an_unknown_name_is_an_error_naming_the_known_ones(scratch):
    scratch.append("unit_known")
    queuety.register("unit_known", queuety.workflow("unit_known").then(steps.step_a))
    with pytest.raises(queuety.UnknownWorkflow) as raised:
        registry.get("unit_missing")
    assert "'unit_missing'" in str(raised.value) and "'unit_known'" in str(raised.value)
    assert "unit_known" in raised.value.known


def test_start_run__a_payload_that_is_not_an_object_is_refused_before_any_write(scratch):
    scratch.append("unit_payload")
    queuety.register("unit_payload", queuety.workflow("unit_payload").then(steps.step_a))
    with pytest.raises(queuety.InvalidPayload, match="must be a JSON object"):
        registry.start_run("unit_payload", [1, 2])  # would need the database if it went on
    with pytest.raises(queuety.InvalidPayload, match="idempotency key"):
        registry.start_run("unit_payload", {}, idempotency_key="  ")


@pytest.mark.parametrize(("expression", "now", "zone", "tick"), [
    ("0 3 * * *", datetime(2026, 12, 1, 2, 59, tzinfo=UTC), "UTC",
     datetime(2026, 11, 30, 3, 0, tzinfo=UTC)),
    ("0 3 * * *", datetime(2026, 12, 1, 3, 0, 40, tzinfo=UTC), "UTC",
     datetime(2026, 12, 1, 3, 0, tzinfo=UTC)),
    ("*/15 * * * *", datetime(2026, 12, 1, 10, 44, 59, tzinfo=UTC), "UTC",
     datetime(2026, 12, 1, 10, 30, tzinfo=UTC)),
    # Monday 09:30 in Paris (UTC+1 in winter) is 08:30 UTC; 1 December 2026 is a Tuesday.
    ("30 9 * * 1", datetime(2026, 12, 1, 12, 0, tzinfo=UTC), "Europe/Paris",
     datetime(2026, 11, 30, 8, 30, tzinfo=UTC)),
    # In summer, Paris is UTC+2.
    ("0 9 * * *", datetime(2026, 7, 1, 8, 0, tzinfo=UTC), "Europe/Paris",
     datetime(2026, 7, 1, 7, 0, tzinfo=UTC)),
    ("0 0 29 2 *", datetime(2026, 12, 1, tzinfo=UTC), "UTC",
     datetime(2024, 2, 29, 0, 0, tzinfo=UTC)),
])
def test_latest_tick__the_latest_matching_minute_at_or_before_now(expression, now, zone, tick):
    assert schedules.latest_tick(schedules.parse_cron(expression), now, ZoneInfo(zone)) == tick


def test_interval_slot__two_fires_of_one_slot_share_it_the_next_slot_differs():
    first = schedules.interval_slot(60, datetime(2026, 12, 1, 10, 0, 5, tzinfo=UTC))
    again = schedules.interval_slot(60, datetime(2026, 12, 1, 10, 0, 59, tzinfo=UTC))
    later = schedules.interval_slot(60, datetime(2026, 12, 1, 10, 1, 0, tzinfo=UTC))
    assert first == again == datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
    assert later == datetime(2026, 12, 1, 10, 1, tzinfo=UTC)


@pytest.mark.parametrize("expression", ["0 3 * *", "61 * * * *", "* 25 * * *", "a b c d e", ""])
def test_parse_cron__a_bad_expression_is_a_clear_error(expression):
    with pytest.raises(queuety.InvalidSchedule, match="cron expression"):
        schedules.parse_cron(expression)


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90), ("30 minutes", 1800), ("1 hour", 3600), ("2d", 172800), ("1 week", 604800),
    ("5m", 300)])
def test_parse_every__reads_seconds_and_units(text, seconds):
    assert schedules.parse_every(text) == seconds


@pytest.mark.parametrize("text", ["0", "1.5 hours", "abc", "3 fortnights", "-5"])
def test_parse_every__refuses_what_is_not_a_whole_positive_interval(text):
    with pytest.raises(queuety.InvalidSchedule, match="not one Queuety reads"):
        schedules.parse_every(text)
