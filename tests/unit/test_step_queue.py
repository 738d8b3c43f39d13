"""A step's ``queue``: resolved like its other options, kept in its definition, routing its
messages; and the I/O lane's refusal to start without PostgreSQL and a real broker."""

from __future__ import annotations

import pytest

import queuety
from queuety.core.definition import WorkflowSpec
from queuety.core.handlers import step_options
from queuety.runtime import lane
from tests import workflows


class OnTheLane(queuety.Step):
    queue = "io"

    async def handle(self, state):
        return {}


def test_queue__keyword_then_class_attribute_then_none():
    assert step_options("s", OnTheLane).queue == "io"
    assert step_options("s", OnTheLane, queue="llm").queue == "llm"
    assert step_options("s", workflows.step_a).queue is None


@pytest.mark.parametrize("bad", ["", "  ", " io", 5, ["io"]])
def test_queue__a_bad_name_is_refused_naming_the_step(bad):
    with pytest.raises(queuety.WorkflowDefinitionError,
                       match=r"queue for step 's' must be a non-blank queue name"):
        step_options("s", workflows.step_a, queue=bad)


def test_queue__kept_in_the_definition_and_routing_each_step():
    flow = (queuety.workflow("routed").on_queue("main").then(workflows.step_a)
            .then(OnTheLane).then(workflows.step_b, queue="hooks")
            .for_each("items", workflows.run_task, queue="io"))
    spec = flow.build()
    again = WorkflowSpec.from_dict(spec.to_dict())
    assert [again.queue_of(i) for i in range(4)] == ["main", "io", "hooks", "io"]
    assert again.definition_hash == spec.definition_hash


def test_queue__unset_leaves_the_definition_hash_as_it_was():
    spec = queuety.workflow("plain").then(workflows.step_a).build()
    assert "queue" not in spec.to_dict()["steps"][0]
    assert spec.queue_of(0) is None


@pytest.mark.parametrize("vendor, broker, missing", [
    ("sqlite", "filesystem://", ["PostgreSQL (the database is sqlite", "a real broker"]),
    ("sqlite", "redis://localhost:6379/0", ["PostgreSQL (the database is sqlite"]),
    ("postgresql", "memory://", ["a real broker (the broker is memory://"]),
])
def test_lane__refuses_the_embedded_default_naming_what_is_missing(vendor, broker, missing):
    message = lane.refusal(vendor, broker)
    assert message is not None and message.startswith("The Queuety I/O lane")
    for part in missing:
        assert part in message
    assert "--pool prefork" in message


@pytest.mark.parametrize("broker", ["redis://localhost:6379/0", "amqp://guest@localhost//"])
def test_lane__starts_on_postgresql_and_a_real_broker(broker):
    assert lane.refusal("postgresql", broker) is None


def test_lane__warns_without_the_connection_pool():
    without = {"default": {"ENGINE": "django.db.backends.postgresql", "OPTIONS": {}}}
    with_pool = {"default": {"OPTIONS": {"pool": {"max_size": 20}}}}
    advice = lane.pool_advice(without, 200)
    assert advice is not None and "OPTIONS']['pool']" in advice and "200 threads" in advice
    assert lane.pool_advice(with_pool, 200) is None
