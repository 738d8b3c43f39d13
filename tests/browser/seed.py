"""Fill the browser tests' database: a user and runs in every status.

Run inside the project (``manage.py shell -c "from tests.browser.seed import main; main()"``)
with the browser world's environment; prints one JSON line with what it made.
"""

from __future__ import annotations

import json
import time

import queuety
from project import workflows as demo
from queuety import operations
from tests.browser import steps

USERNAME, PASSWORD = "operator", "operator-pass-1"


def _wait(run_id: int, statuses: tuple[str, ...], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while queuety.workflow_status(run_id).status not in statuses:
        if time.monotonic() > deadline:
            raise SystemExit(f"Run {run_id} did not reach {statuses} within {timeout}s.")
        time.sleep(0.1)


def main() -> None:
    from django.contrib.auth.models import User

    User.objects.create_superuser(USERNAME, "operator@example.com", PASSWORD)
    orders = demo.order_fulfilment().version("orders.v3").max_transitions(20)
    made = {"completed": [orders.idempotency_key(f"order:{1000 + n}").dispatch(
        {**demo.DEMO_ORDER, "order_id": 1000 + n}) for n in range(3)]}
    made["failed"] = steps.catalogue_import().dispatch({"catalogue": "spring-2025"})
    made["input"] = steps.expense_claim().idempotency_key("expense:311").dispatch(
        {"claim": 311, "employee": "ada@example.com"})
    made["signal"] = steps.payment_reconciliation().dispatch({"invoice": "INV-2025-0042"})
    made["paused"] = steps.publishing().dispatch({"article_id": 6, "words": 900})
    made["refund"] = steps.refund_request().idempotency_key("refund:5521").dispatch(
        {"ticket": 5521, "amount_cents": 4500})
    made["waiting"] = steps.publishing().idempotency_key("article:7").dispatch(
        {"article_id": 7, "words": 1200})
    for run_id in made["completed"] + [made["failed"]]:
        _wait(run_id, ("completed", "failed"))
    _wait(made["paused"], ("waiting_for_signal",))
    operations.pause(made["paused"], actor="admin:operator")
    _wait(made["refund"], ("waiting_for_signal",))
    _wait(made["waiting"], ("waiting_for_signal",))
    print(json.dumps(made))
