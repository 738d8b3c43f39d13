"""The demo project's settings, with the observability switches of the environment."""

import os

from project.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "qbench.obs"]  # noqa: F405
QUEUETY = {
    "METRICS": bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR")),
    "TRACING": bool(os.environ.get("QBENCH_OBS_TRACING")),
}
LOGGING["loggers"]["queuety"]["level"] = "WARNING"  # noqa: F405
