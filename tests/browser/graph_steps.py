"""Steps of the graph screenshots' workflow, an order's review: a compensated reservation, a
route, a card charge that fails once, a parallel notification, a for_each over parcels, a
tracking loop, a child run and a wait for the customer's feedback (the worker imports them)."""

from __future__ import annotations

import queuety


def reserve_stock(state):
    return {"reserved": len(state["parcels"])}


def release_stock(state):
    return {"reserved": 0}


def assess_risk(state):
    return "low" if state["amount"] < 500 else "high"


def charge_card(state, context):
    if context.attempt == 1:  # the card network times out once: the graph shows 2 attempts
        raise ConnectionError(f"Card network timed out charging order {state['order']}.")
    return {"charged": state["amount"]}


def refund_card(state):
    return {"charged": 0}


def send_receipt(state):
    return {"receipt": True}


def notify_warehouse(state):
    return {"warehouse": True}


def pack_parcel(state, item, index):
    return {"parcel": item, "packed": True}


def check_tracking(state):
    polls = state.get("polls", 0) + 1
    return {"polls": polls, "delivered": polls >= 2}


def ask_survey(state):
    return {"survey_sent": True}


def order_review() -> queuety.WorkflowBuilder:
    """Every kind of step the graph draws, in one workflow."""
    survey = queuety.workflow("order_survey").then(ask_survey)
    return (queuety.workflow("order_review").version("review.v1").max_transitions(60)
            .then(reserve_stock).compensate_with(release_stock)
            .route(assess_risk, {"low": "charge_card", "high": "manual_review"})
            .wait_for_approval(name="manual_review")
            .then(charge_card, retry=queuety.RetryPolicy(max_attempts=3, initial_delay=0.2,
                                                         jitter=0))
            .compensate_with(refund_card)
            .parallel([send_receipt, notify_warehouse], name="notify")
            .for_each("parcels", pack_parcel, name="pack_parcels")
            .then(check_tracking)
            .repeat_until("check_tracking", "delivered", True, max_iterations=5,
                          name="until_delivered")
            .run_workflow("survey", survey)
            .wait_for_signal("feedback", name="await_feedback"))


def long_chain(steps: int = 50) -> queuety.WorkflowBuilder:
    """A workflow of ``steps`` steps, to see the graph readable at that size."""
    builder = queuety.workflow("fifty_steps").version("long.v1")
    for n in range(steps):
        builder = builder.then(reserve_stock, name=f"step_{n:02d}")
    return builder


def seed() -> None:
    """Start the order review (it stops at the feedback wait) and the 50-step workflow (it
    completes); print one JSON line with their run and definition ids."""
    import json
    import time

    from queuety.models import WorkflowRun

    runs = {"review": order_review().dispatch({"order": 77, "amount": 120,
                                               "parcels": ["A-1", "A-2", "A-3"]}),
            "long": long_chain().dispatch({"parcels": []})}
    deadline = time.monotonic() + 90
    for name, wanted in (("review", "waiting_for_signal"), ("long", "completed")):
        while queuety.workflow_status(runs[name]).status != wanted:
            if time.monotonic() > deadline:
                raise SystemExit(f"Run {runs[name]} ({name}) did not reach {wanted} in 90 s: "
                                 f"{queuety.workflow_status(runs[name])}.")
            time.sleep(0.1)
    definitions = {f"{name}_definition": WorkflowRun.objects.get(pk=pk).definition_id
                   for name, pk in runs.items()}
    print(json.dumps({**runs, **definitions}))
