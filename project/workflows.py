"""Example workflows of the demo project.

Steps are module-level classes or functions, so any worker can import them by dotted path.
"""

import queuety


def validate_order(state):
    """Check the order and compute its total."""
    items = state["items"]
    if not items:
        raise queuety.PermanentError(f"Order {state['order_id']} has no items.")
    return {"total_cents": sum(item["qty"] * item["price_cents"] for item in items)}


class ReserveStock(queuety.Step):
    """Reserve every line of the order (a real app would call its inventory service)."""

    def handle(self, state):
        return {"reservations": [f"R-{state['order_id']}-{item['sku']}" for item in state["items"]]}


class ChargeCard(queuety.Step):
    """Charge the customer; network errors are retried with a short, bounded back-off."""

    retry = queuety.RetryPolicy(max_attempts=4, initial_delay=0.5, retry_on=[ConnectionError])
    # A payment provider that stops answering must not hold a worker: interrupted after 30 s
    # (StepTimeout), and its process killed if it does not stop (the message's hard limit).
    timeout = 30

    def handle(self, state):
        return {"charge_id": f"ch_{state['order_id']}_{state['total_cents']}"}


def send_receipt(state):
    """Email the receipt."""
    return {"receipt_sent_to": state["email"]}


@queuety.register("order_fulfilment")
def order_fulfilment():
    """Return the builder of the demo's order workflow."""
    return (
        queuety.workflow("order_fulfilment")
        .then(validate_order)
        .then(ReserveStock)
        .then(ChargeCard)
        .then(send_receipt)
    )


DEMO_ORDER = {
    "order_id": 1001,
    "email": "ada@example.com",
    "items": [
        {"sku": "BOOK-42", "qty": 2, "price_cents": 1250},
        {"sku": "MUG-7", "qty": 1, "price_cents": 900},
    ],
}
