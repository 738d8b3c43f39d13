"""queuety.scope's rules that need no database: who is narrowed, and a hook that returns
something other than a queryset of runs (querysets are built, never evaluated)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from queuety import scope
from queuety.models import Signal, WorkflowRun


def listed(user, runs):
    return list(runs.none())  # a list, not a queryset (none(): no query is made)


def tenant(user, runs):
    return runs.filter(state__tenant=user.last_name)


USER = SimpleNamespace(pk=7, last_name="a")


def test_scoped_runs__a_hook_that_returns_no_queryset_is_a_configuration_error():
    with override_settings(QUEUETY={"RUN_SCOPE": listed}), \
            pytest.raises(ImproperlyConfigured, match=r"returned list for user 7; it must "
                                                      r"return the queryset of runs"):
        scope.scoped_runs(USER, WorkflowRun.objects.none())


def test_scoped_runs__narrows_every_user_it_is_given_and_no_operator():
    with override_settings(QUEUETY={"RUN_SCOPE": tenant}):
        assert "tenant" in str(scope.scoped_runs(USER, WorkflowRun.objects.all()).query)
        superuser = SimpleNamespace(pk=1, last_name="", is_superuser=True)
        assert "tenant" in str(scope.scoped_runs(superuser, WorkflowRun.objects.all()).query)
        # None: an operator's process (the CLI without --as-user), with full access.
        assert "WHERE" not in str(scope.scoped_runs(None, WorkflowRun.objects.all()).query)


def test_through_runs__is_one_subquery_on_the_scoped_runs():
    with override_settings(QUEUETY={"RUN_SCOPE": tenant}):
        sql = str(scope.through_runs(USER, Signal.objects.all()).query)
    assert sql.count("SELECT") == 2 and "tenant" in sql
    with override_settings(QUEUETY={}):
        assert "WHERE" not in str(scope.through_runs(USER, Signal.objects.all()).query)


def everyone_of_tenant_a(user, runs):
    # Ignores the queryset it is given: a mistake the scope must survive.
    return WorkflowRun.objects.filter(state__tenant="a")


def test_scoped_runs__a_hook_that_ignores_its_queryset_still_narrows_the_callers():
    with override_settings(QUEUETY={"RUN_SCOPE": everyone_of_tenant_a}):
        sql = str(scope.scoped_runs(USER, WorkflowRun.objects.filter(pk=5)).query)
    # The caller's own filter (one run by id) stays; the scope is joined to it.
    assert '"queuety_workflowrun"."id" = 5' in sql and "tenant" in sql
