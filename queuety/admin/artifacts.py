"""The run page's artifacts and streamed chunks: the artifacts' list (never their content)
with a download per artifact, and the chunk count of each streaming step row with a view of
its chunks.

The list reads the artifact rows without their content column, so a run with megabytes of
artifacts renders as fast as one without; the content is read only by a download.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db.models import Count
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.template.defaultfilters import filesizeformat

from queuety import exceptions, outputs
from queuety.core import artifacts as rules
from queuety.models import StepChunk, StepRun

#: The most artifacts the run page lists (the API and the CLI list them all).
PAGE_ARTIFACTS = 100


def artifact_rows(run_id: int, total: int,
                  download_url: Callable[[str], str]) -> dict[str, Any]:
    """The run page's artifacts section: the first :data:`PAGE_ARTIFACTS` rows by key (key,
    kind, size, step, updated, download link) and the ``total`` count (the status has it)."""
    found = outputs.artifacts(run_id, limit=PAGE_ARTIFACTS)
    return {"artifacts": [{**item, "size_text": filesizeformat(item["size"]),
                           "url": download_url(item["key"])} for item in found],
            "artifact_total": total}


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


def with_chunk_counts(step_runs: list[StepRun],
                      chunks_url: Callable[[int], str]) -> list[dict[str, Any]]:
    """The run page's step executions, each with how many chunks it streamed (one query for
    all of them) and the address of those chunks."""
    counts = dict(StepChunk.objects.filter(step_run_id__in=[row.pk for row in step_runs])
                  .values_list("step_run_id").annotate(n=Count("pk")).values_list(
                      "step_run_id", "n"))
    return [{"row": row, "chunks": counts.get(row.pk, 0),
             "chunks_url": chunks_url(row.pk)} for row in step_runs]


#: The most chunks the admin's chunk view shows (the API pages through all of them).
PAGE_CHUNKS = 5000


def chunks(request: HttpRequest, run_id: int, step_run_id: int, allowed: bool) -> HttpResponse:
    """``GET <id>/chunks/<step run id>/``: a streaming step row's chunks (index, attempt,
    content), the first :data:`PAGE_CHUNKS`, as JSON."""
    if not allowed:
        raise PermissionDenied
    row = StepRun.objects.filter(pk=step_run_id, run_id=run_id).values("step_name").first()
    if row is None:
        raise Http404(f"Workflow run {run_id} has no step execution {step_run_id}.")
    found = outputs.raw_chunks(run_id, row["step_name"], step_run_id, -1, PAGE_CHUNKS)
    return JsonResponse({"run_id": run_id, "step_run_id": step_run_id,
                         "step_name": row["step_name"],
                         "chunks": [{"index": index, "attempt": attempt,
                                     "content": json.loads(text)}
                                    for index, text, attempt, _created in found]},
                        json_dumps_params={"ensure_ascii": False, "indent": 2})
