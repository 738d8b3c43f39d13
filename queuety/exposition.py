"""The Prometheus endpoint, opt-in: add it to the site's URLs::

    path("queuety/metrics", queuety.exposition.metrics_view)

A scraper sends ``Authorization: Bearer <QUEUETY["METRICS_TOKEN"]>``; without a token set, only
a signed-in user with the permission to view runs may read it.
"""

from __future__ import annotations

import hmac

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from queuety import metrics
from queuety.conf import settings


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Answer with the Prometheus text, or 401/403 for a caller who may not read it."""
    token = settings.METRICS_TOKEN
    given = request.headers.get("Authorization", "")
    if token is not None and given.startswith("Bearer "):
        if not hmac.compare_digest(given.removeprefix("Bearer ").encode(), token.encode()):
            return HttpResponse("The metrics token is wrong.\n", status=403,
                                content_type="text/plain")
    elif not request.user.is_authenticated:
        return HttpResponse("Sign in, or send QUEUETY['METRICS_TOKEN'] as a Bearer token.\n",
                            status=401, content_type="text/plain")
    elif not request.user.has_perm("queuety.view_workflowrun"):
        return HttpResponse("Reading the metrics needs the permission to view workflow "
                            "runs.\n", status=403, content_type="text/plain")
    body, content_type = metrics.exposition(
        openmetrics="application/openmetrics-text" in request.headers.get("Accept", ""))
    return HttpResponse(body, content_type=content_type)
