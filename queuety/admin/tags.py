"""The runs changelist's tags: the ``tag`` filter in its sidebar, the ``tags`` column, and a
tag typed in its search box (``customer:42``); the runs' GIN index serves the filters."""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.contrib import admin, messages
from django.db.models import Q, QuerySet
from django.http import HttpRequest

from queuety.core.describe import tags_text
from queuety.core.tags import parse_filters
from queuety.models import WorkflowRun
from queuety.store.tags import tagged


class TagFilter(admin.SimpleListFilter):
    """Runs carrying a tag, ``?tag=customer:42``. The choices are read from the runs the user
    may see (the admin's scoped queryset, so never another tenant's tags): the tags of the
    newest ``SAMPLE`` of them, at most ``CHOICES`` pairs (the most frequent), and the one
    selected. Any other tag is one edit of the URL away."""

    title = "tag"
    parameter_name = "tag"
    #: How many of the newest runs the choices come from (one small read of their tags).
    SAMPLE = 200
    #: At most this many choices: the pairs most of the sample carries.
    CHOICES = 50

    def lookups(self, request: HttpRequest,
                model_admin: admin.ModelAdmin[Any]) -> list[tuple[str, str]]:
        sample = (model_admin.get_queryset(request).order_by("-pk")
                  .values_list("tags", flat=True)[:self.SAMPLE])
        counts = Counter(f"{key}:{value}" for tags in sample if isinstance(tags, dict)
                         for key, value in tags.items())
        seen = {pair for pair, _ in counts.most_common(self.CHOICES)}
        if self.value() and self._wanted() is not None:
            seen.add(str(self.value()))
        return [(pair, pair) for pair in sorted(seen)]

    def _wanted(self) -> dict[str, str] | None:
        try:
            return parse_filters([str(self.value())], ":")
        except ValueError:
            return None

    def queryset(self, request: HttpRequest,
                 queryset: QuerySet[WorkflowRun]) -> QuerySet[WorkflowRun]:
        value = self.value()
        if not value:
            return queryset
        try:
            return queryset.filter(tagged(parse_filters([value], ":")))
        except ValueError as error:
            # A hand-edited URL: say what is wrong, and show the list unfiltered.
            messages.error(request, f"{error} The list is shown without the tag filter.")
            return queryset


def tag_search(term: str) -> Q | None:
    """The runs a search term names when it is a tag (``customer:42``); ``None`` when it is
    not one (a name or key with a colon in it, say)."""
    if ":" not in term:
        return None
    try:
        return tagged(parse_filters([term], ":"))
    except ValueError:
        return None


class TagColumn:
    """The changelist's ``tags`` column (the row's ``tags``, read with it)."""

    @admin.display(description="tags")
    def tags_display(self, run: WorkflowRun) -> str:
        return tags_text(run.tags) if run.tags else "-"
