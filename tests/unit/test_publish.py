"""Sending by name (queuety/publish.py) under Celery's ``task_always_eager``: every sender runs
its task in this process through the task registry, ``send_later`` included."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery, current_app

from queuety import publish


@pytest.fixture
def eager() -> Iterator[Celery]:
    """An eager Celery app as the current app. Its broker is in memory, so a message sent by
    name instead of run here is swallowed at once: the task never runs and the test says so."""
    app = Celery("eager", set_as_current=False)
    app.conf.update(task_always_eager=True, broker_url="memory://")
    previous = current_app._get_current_object()
    app.set_current()
    try:
        yield app
    finally:
        previous.set_current()


def test_send_later__runs_the_task_here_under_task_always_eager(eager):
    ran: list[dict[str, object]] = []

    @eager.task(name="tests.look_once")
    def look_once(**kwargs):
        ran.append(kwargs)

    publish.send_later("tests.look_once", {"schedule": "nightly", "after": 7}, 60)
    assert ran == [{"schedule": "nightly", "after": 7}]


def test_send_later__a_task_sending_itself_later_from_its_eager_run_runs_once(eager, caplog):
    # As a buffered schedule fire does while the run it waits for is still live: eager mode
    # runs the countdown at once, so without a stop this recursed until the stack ran out.
    ran: list[dict[str, object]] = []

    @eager.task(name="tests.look_again")
    def look_again(**kwargs):
        ran.append(kwargs)
        publish.send_later("tests.look_again", kwargs, 60)

    publish.send_later("tests.look_again", {"schedule": "nightly", "after": 7}, 60)
    assert ran == [{"schedule": "nightly", "after": 7}]
    assert "was not sent again from its own eager run" in caplog.text
    # The stop is for that run only: the next send runs the task again.
    publish.send_later("tests.look_again", {"schedule": "nightly", "after": 8}, 60)
    assert ran[-1] == {"schedule": "nightly", "after": 8} and len(ran) == 2
