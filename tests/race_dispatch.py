"""One contender of the idempotency race: dispatch when the go-file appears, print the id.

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
# The first step is due in 5 s (the broker carries that countdown), so the sweeper, which
# re-publishes due steps nobody consumed, cannot add messages while the race is counted.
builder = (queuety.workflow("race").on_queue(queue).idempotency_key(key)
           .delay(seconds=5).then(workflows.step_a))
from queuety import services  # noqa: E402

services.definition_id(builder.build())  # resolve handlers and the definition row beforehand
print("ready", flush=True)
while not os.path.exists(go_file):
    time.sleep(0.001)
print(builder.dispatch({"token": key}), flush=True)
