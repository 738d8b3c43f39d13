"""The run page's artifacts: their list (never their content) and a download per artifact.

The list reads the artifact rows without their content column, so a run with megabytes of
artifacts renders as fast as one without; the content is read only by a download.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.template.defaultfilters import filesizeformat

from queuety import exceptions, outputs
from queuety.core import artifacts as rules

#: The most artifacts the run page lists (the API and the CLI list them all).
PAGE_ARTIFACTS = 100


def artifact_rows(run_id: int, download_url: Callable[[str], str]) -> dict[str, Any]:
    """The run page's artifacts section: up to :data:`PAGE_ARTIFACTS` rows (key, kind, size,
    step, updated, download link) and the total count."""
    found = outputs.artifacts(run_id)
    return {"artifacts": [{**item, "size_text": filesizeformat(item["size"]),
                           "url": download_url(item["key"])}
                          for item in found[:PAGE_ARTIFACTS]],
            "artifact_total": len(found)}


def download(request: HttpRequest, run_id: int, key: str, allowed: bool) -> HttpResponse:
    """``GET <id>/artifacts/<key>/``: the artifact's content as a file."""
    if not allowed:
        raise PermissionDenied
    try:
        kind, data = outputs.artifact_bytes(run_id, key)
    except (exceptions.RunNotFound, exceptions.ArtifactNotFound) as error:
        raise Http404(str(error)) from None
    response = HttpResponse(data, content_type=rules.CONTENT_TYPES[kind])
    response["Content-Disposition"] = (
        f'attachment; filename="{rules.file_name(run_id, key, kind)}"')
    response["X-Content-Type-Options"] = "nosniff"
    return response
