"""One contender of the idempotency race: dispatch when the go-file appears; print the run id
and how many messages this process published.

    python -m tests.race_dispatch KEY QUEUE GO_FILE
"""

import os
import sys
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()

import queuety  # noqa: E402
from tests import workflows  # noqa: E402

key, queue, go_file = sys.argv[1:4]
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
give_up = time.monotonic() + 300  # the test is gone if the line never opens
while not os.path.exists(go_file):
    if time.monotonic() > give_up:
        sys.exit("race_dispatch: no start signal within 300 s; giving up.")
    time.sleep(0.001)
print(builder.dispatch({"token": key}), len(sent), flush=True)
