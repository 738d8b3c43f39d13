"""The demo project's example order, as the JSON a shell command takes."""

import json

from project.workflows import DEMO_ORDER

DEMO_ORDER_JSON = json.dumps(DEMO_ORDER)
