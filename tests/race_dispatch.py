"""One contender of the idempotency race: dispatch when "go" arrives on stdin; print the run
id and how many messages this process published.

    python -m tests.race_dispatch KEY QUEUE

Waiting contenders block on a read (no polling), so the ones still starting get the CPU, and
the test's one write per contender opens the line for all of them at once.
"""

import os
import sys

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()

import queuety  # noqa: E402
from tests import workflows  # noqa: E402

key, queue = sys.argv[1:3]
builder = (queuety.workflow("race").on_queue(queue).idempotency_key(key)
           .then(workflows.step_a))
from queuety import publish  # noqa: E402
from queuety.store.definitions import definition_id  # noqa: E402

# Count the messages this contender hands to Celery (they are still really sent).
sent = []
_send = publish.publish


def _counting(messages):
    messages = list(messages)
    sent.extend(messages)
    _send(messages)


publish.publish = _counting

definition_id(builder.build())  # resolve handlers and the definition row beforehand
print("ready", flush=True)
if sys.stdin.readline().strip() != "go":  # end of file: the test is gone
    sys.exit("race_dispatch: the test closed the line without a start signal; giving up.")
print(builder.dispatch({"token": key}), len(sent), flush=True)
