"""A step's ``queue``: resolved like its other options, kept in its definition, routing its
messages; and the I/O lane's refusal to start without PostgreSQL and a real broker, or with
more PostgreSQL connections than QUEUETY['LANE_MAX_CONNECTIONS'] (and queuety.W007's rule)."""

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


WITHOUT_POOL = {"default": {"ENGINE": "django.db.backends.postgresql", "OPTIONS": {}}}


def _pooled(pool):
    return {"default": {"ENGINE": "django.db.backends.postgresql", "OPTIONS": {"pool": pool}}}


def test_lane__without_the_pool_more_threads_than_the_bound_refuse_naming_both_fixes():
    message = lane.connection_refusal(WITHOUT_POOL, 200, 20)
    assert message is not None
    assert message.startswith("This I/O lane worker (--pool threads) runs 200 threads")
    assert "more than QUEUETY['LANE_MAX_CONNECTIONS'] (20)" in message
    assert "DATABASES['default']['OPTIONS']['pool'] = {'min_size': 2, 'max_size': 20}" in message
    assert "with the main process's 3, up to 203 connections" in message
    assert "--concurrency 17 or fewer" in message
    # At the bound, the main process's own connections counted: starts.
    assert lane.connection_refusal(WITHOUT_POOL, 17, 20) is None
    assert lane.connection_refusal(WITHOUT_POOL, 18, 20) is not None


@pytest.mark.parametrize("pool, size", [
    ({"max_size": 20}, 20), ({"min_size": 2, "max_size": 5}, 5), ({"min_size": 6}, 6),
    (True, lane.POOL_DEFAULT_SIZE),
])
def test_lane__with_the_pool_its_size_is_the_bound_whatever_the_threads(pool, size):
    assert lane.pool_size(_pooled(pool)) == size
    assert lane.connection_refusal(_pooled(pool), 200, size) is None
    message = lane.connection_refusal(_pooled(pool), 200, size - 1)
    assert message is not None and f"open {size} PostgreSQL connections" in message
    assert f"Lower the pool's max_size to {size - 1} or fewer" in message


@pytest.mark.parametrize("databases, bound, server, warned", [
    (WITHOUT_POOL, 20, 100, False),
    (WITHOUT_POOL, 97, 100, True),          # 100 less 3 reserved: one worker takes them all
    (WITHOUT_POOL, 96, 100, False),
    (_pooled({"max_size": 100}), 20, 100, True),   # the pool's size counts, not the setting
    (_pooled({"max_size": 20}), 500, 100, False),
])
def test_w007__one_lane_worker_that_could_take_every_connection_is_warned_about(
        databases, bound, server, warned):
    advice = lane.server_advice(databases, bound, server, 3)
    assert (advice is not None) is warned
    if warned:
        assert advice.startswith("One I/O lane worker may open")
        assert f"the server takes {server - 3} (max_connections {server} less 3" in advice
