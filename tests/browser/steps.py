"""Steps of the browser scenario's workflows (the worker subprocess imports them by path)."""

from __future__ import annotations

import queuety


def draft_article(state):
    """Write a draft (a real site would call its editor or a model)."""
    return {"draft": f"Durable workflows in Django, {state['words']} words",
            "reviewers": ["editor@example.com"]}


def check_links(state):
    return {"links_ok": True}


def publish_article(state):
    return {"published_url": f"https://example.com/articles/{state['article_id']}"}


def fetch_supplier_feed(state):
    raise ConnectionError(f"Supplier API for catalogue {state['catalogue']} is unreachable "
                          "(connection refused).")


def assess_refund(state):
    return {"risk": "low" if state["amount_cents"] < 10_000 else "high"}


def reconcile(state):
    return {"reconciled": True}


def publishing():
    return (queuety.workflow("publish_article").version("editorial.v2")
            .max_transitions(10).max_cost_units(12)
            .then(draft_article, cost_units=3).then(check_links).wait_for_approval()
            .then(publish_article))


def catalogue_import():
    return (queuety.workflow("import_catalogue").version("catalogue.v5").max_transitions(40)
            .then(fetch_supplier_feed))


def expense_claim():
    return (queuety.workflow("expense_claim").version("finance.v1").max_transitions(8)
            .wait_for_input(schema={
                "type": "object", "required": ["decision", "amount"],
                "properties": {"decision": {"enum": ["approve", "reject"]},
                               "amount": {"type": "integer", "minimum": 0}}})
            .then(reconcile))


def payment_reconciliation():
    return (queuety.workflow("payment_reconciliation").max_transitions(6)
            .wait_for_signal("payment_received", correlation_key="invoice")
            .then(reconcile))


def refund_request():
    return (queuety.workflow("refund_request").version("support.v4").max_transitions(8)
            .then(assess_refund).wait_for_decision().then(reconcile))
