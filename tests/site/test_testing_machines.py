"""A state machine driven by ``queuety.testing`` (no broker, no worker), as a site tests one."""

from __future__ import annotations

import queuety
from queuety.testing import run_workflow
from tests import machine_steps


def test_a_machine_moves_on_signals_in_the_test(db):
    run = run_workflow(machine_steps.session("site_session").compile(), {"user": 1})
    run.assert_status("waiting_for_signal")
    assert queuety.machine_status(run.id).state == "idle"
    run.signal("message", {"text": "hi"})
    status = queuety.machine_status(run.id)
    assert status.state == "active" and status.data["last_reply"] == "re: hi"
    run.signal("close", {})
    run.assert_status("completed")
    assert [h["to"] for h in queuety.machine_status(run.id).history] == ["active", "closed"]
