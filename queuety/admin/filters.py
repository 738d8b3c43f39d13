"""The runs changelist's filters and its paginator for big tables."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Model, QuerySet
from django.http import (
    HttpRequest,
)
from django.utils.functional import cached_property

from queuety.admin.display import HUMAN_WAITS
from queuety.models import (
    RunStatus,
    WorkflowDefinition,
    WorkflowRun,
)
from queuety.queries import waiting_on

# -- what waits where ---------------------------------------------------------------------------

# -- counting big tables -----------------------------------------------------------------------

if TYPE_CHECKING:  # Paginator is generic in django-stubs only: not subscriptable at run time
    _Paginator = Paginator[Model]
else:
    _Paginator = Paginator


class EstimatedCountPaginator(_Paginator):
    """A paginator that takes PostgreSQL's row estimate for big result sets.

    ``SELECT COUNT(*)`` reads every matching row, which dominates a changelist over millions of
    runs. ``EXPLAIN`` plans the same query without reading rows and says how many it expects.
    When it expects fewer than ``exact_below`` rows an exact count is cheap, so it is made;
    above, the estimate is used and :attr:`estimated` is set so the page can say "about".
    """

    exact_below = 10_000
    estimated = False
    object_list: QuerySet[Model]  # for mypy: this paginator pages querysets only

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        connection = connections[queryset.db]
        if connection.vendor != "postgresql":
            return super().count
        sql, params = queryset.order_by().query.get_compiler(using=queryset.db).as_sql()
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
            plan = cursor.fetchone()[0]
        if isinstance(plan, str):
            plan = json.loads(plan)
        expected = int(plan[0]["Plan"]["Plan Rows"])
        if expected < self.exact_below:
            return super().count
        self.estimated = True
        return expected


# -- list filters --------------------------------------------------------------------------------

class NameFilter(admin.SimpleListFilter):
    """Filter runs by workflow name; choices come from the (small) definitions table."""

    title = "workflow"
    parameter_name = "workflow"

    def lookups(self, request: HttpRequest,
                model_admin: admin.ModelAdmin[Any]) -> list[tuple[str, str]]:
        names = (WorkflowDefinition.objects.order_by("name").values_list("name", flat=True)
                 .distinct())
        return [(name, name) for name in names]

    def queryset(self, request: HttpRequest,
                 queryset: QuerySet[WorkflowRun]) -> QuerySet[WorkflowRun]:
        return queryset.filter(name=self.value()) if self.value() else queryset


class VersionFilter(admin.SimpleListFilter):
    """Filter runs by the ``.version()`` label of their definition."""

    title = "version"
    parameter_name = "version"
    #: The choice for definitions without a version label.
    UNLABELLED = "(none)"

    def _versions(self) -> dict[int, str | None]:
        if not hasattr(self, "_by_definition"):  # one query per request, not one per use
            self._by_definition = dict(
                WorkflowDefinition.objects.values_list("pk", "definition__version"))
        return self._by_definition

    def lookups(self, request: HttpRequest,
                model_admin: admin.ModelAdmin[Any]) -> list[tuple[str, str]]:
        versions = sorted({v for v in self._versions().values() if v is not None})
        return [(v, v) for v in versions] + [(self.UNLABELLED, "no version label")]

    def queryset(self, request: HttpRequest,
                 queryset: QuerySet[WorkflowRun]) -> QuerySet[WorkflowRun]:
        wanted = self.value()
        if not wanted:
            return queryset
        # Resolved to definition ids so the filter runs on the runs' definition_id index.
        match = None if wanted == self.UNLABELLED else wanted
        ids = [pk for pk, version in self._versions().items() if version == match]
        return queryset.filter(definition_id__in=ids)


class WaitingFilter(admin.SimpleListFilter):
    """Filter runs by what they wait for: a person (of each kind), a signal, child workflows."""

    title = "waiting for"
    parameter_name = "waiting"

    def lookups(self, request: HttpRequest,
                model_admin: admin.ModelAdmin[Any]) -> list[tuple[str, str]]:
        return [("person", "a person (any)"), *HUMAN_WAITS.items(), ("signal", "a signal"),
                ("workflows", "child workflows")]

    def queryset(self, request: HttpRequest,
                 queryset: QuerySet[WorkflowRun]) -> QuerySet[WorkflowRun]:
        wanted = self.value()
        if wanted == "workflows":
            return queryset.filter(status=RunStatus.WAITING_FOR_WORKFLOWS)
        if wanted == "person":
            return queryset.filter(waiting_on(HUMAN_WAITS))
        if wanted in (*HUMAN_WAITS, "signal"):
            return queryset.filter(waiting_on([wanted]))
        return queryset


class DefinitionFilter(admin.SimpleListFilter):
    """Runs of one exact definition; shown only while selected (from a run or definition page).

    Listing every definition here would not scale; the definitions changelist links to it.
    """

    title = "definition"
    parameter_name = "definition"

    def lookups(self, request: HttpRequest,
                model_admin: admin.ModelAdmin[Any]) -> list[tuple[str, str]]:
        value = self.value()
        if not (value and value.isdigit()):
            return []
        found = WorkflowDefinition.objects.filter(pk=int(value)).first()
        return [(value, str(found) if found else f"#{value} (deleted)")]

    def queryset(self, request: HttpRequest,
                 queryset: QuerySet[WorkflowRun]) -> QuerySet[WorkflowRun]:
        value = self.value()
        if value and value.isdigit():
            return queryset.filter(definition_id=int(value))
        return queryset


# -- actions on one run --------------------------------------------------------------------------
