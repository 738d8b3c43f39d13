"""Tenants kept apart: every API endpoint (enumerated from the URL resolver, so a new one
cannot be forgotten), the admin's pages and the CLI's ``--as-user``, called by the users of
two tenants against each other's runs and against their own.

Tenancy is ``QUEUETY["RUN_SCOPE"] = tests.workflows.tenant_scope``: a user's tenant is their
last name, a run's the ``tenant`` key of its state. Each tenant has runs parked at an
approval with events, a streamed step's chunks and an artifact. A run of the other tenant
must be a 404 everywhere (never a 403, which would confirm it exists) and nothing may be
written to it; lists, counts and bulk actions must never hold or touch it; one's own runs
stay reachable. Every leak found is collected, so the figure is "leaks: N" rather than the
first failure (docs/reliability.md, "Tenants kept apart").

``QUEUETY_TEST_TENANCY=access-only`` runs the same matrix with ``RUN_ACCESS`` alone (the
per-object hook a site had before ``RUN_SCOPE``), to count what it leaves open.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.models import Q
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import URLPattern, get_resolver
from django.utils import timezone
from rest_framework.test import APIClient

import queuety
from queuety import approvals, bulk_actions, queues, registry
from queuety.models import (
    Artifact,
    BulkOperation,
    Event,
    QueuePause,
    Signal,
    StepRun,
    WebhookDelivery,
    WebhookEndpoint,
    WorkflowRun,
)
from tests import job_tasks, streaming_steps, workflows
from tests.integration.conftest import wait_for
from tests.settings import QUEUETY as TEST_QUEUETY

API = "/queuety/api"
ADMIN = "/admin/queuety"
ACCESS_ONLY = os.environ.get("QUEUETY_TEST_TENANCY") == "access-only"
TENANCY = ({**TEST_QUEUETY, "RUN_ACCESS": "tests.workflows.tenant_access"} if ACCESS_ONLY
           else {**TEST_QUEUETY, "RUN_SCOPE": "tests.workflows.tenant_scope"})
PERMISSIONS = ("view_workflowrun", "signal_workflowrun", "add_workflowrun",
               "change_workflowrun", "view_webhookdelivery")
METHODS = ("get", "post", "put", "patch", "delete")


@dataclass
class Tenant:
    name: str
    user: User
    runs: list[int]
    stream_row: int  # the step row of run[0]'s streamed step (the admin's chunk view)
    link: str  # an approval link of runs[0]
    key: str  # the idempotency key that started runs[-1]


def tenant_user(tenant: str) -> User:
    user = User.objects.create_user(f"{tenant}{uuid.uuid4().hex[:8]}", password="pw",
                                    last_name=tenant, is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(
        codename__in=PERMISSIONS, content_type__app_label="queuety"))
    return User.objects.get(pk=user.pk)


@pytest.fixture(scope="module")
def world(worker):
    name = f"tenants_{uuid.uuid4().hex[:6]}"
    spec = (queuety.workflow(name).then(streaming_steps.Tokens, name="stream")
            .wait_for_approval(name="review").then(workflows.step_a))
    tenants = {}
    for tenant in ("a", "b"):
        runs = [spec.dispatch({"token": uuid.uuid4().hex[:8], "n": 3, "tenant": tenant})
                for _ in range(2)]
        key = f"tenant-{tenant}-{uuid.uuid4().hex[:8]}"
        runs.append(registry.start_run("reg_approval", {"tenant": tenant},
                                       idempotency_key=key)[0])
        for run_id in runs:
            wait_for(run_id, statuses=("waiting_for_signal",), worker=worker)
        row = StepRun.objects.get(run_id=runs[0], step_name="stream").pk
        tenants[tenant] = Tenant(tenant, tenant_user(tenant), runs, row,
                                 approvals.approval_link(runs[0]), key)
    return name, tenants


def client(user: User) -> APIClient:
    api = APIClient()
    api.force_authenticate(user)
    return api


def footprint(run_ids: list[int]) -> list[tuple]:
    """What a call must not change about another tenant's runs."""
    return [(pk, WorkflowRun.objects.get(pk=pk).status,
             Signal.objects.filter(run_id=pk).count(), Event.objects.filter(run_id=pk).count(),
             sorted(Artifact.objects.filter(run_id=pk).values_list("key", flat=True)))
            for pk in run_ids]


def endpoints() -> set[tuple[str | None, str]]:
    """Every (URL name, method) of queuety.api.urls: the matrix must cover each."""
    found = set()
    for pattern in get_resolver("queuety.api.urls").url_patterns:
        assert isinstance(pattern, URLPattern)
        view = getattr(pattern.callback, "view_class", None)
        methods = ["get"] if view is None else [m for m in METHODS if hasattr(view, m)]
        found |= {(pattern.name, method.upper()) for method in methods}
    return found


# -- the API matrix ---------------------------------------------------------------------------

def _json(api: APIClient, method: str, path: str, body: object = None):
    return getattr(api, method.lower())(path, data=json.dumps(body if body is not None else {}),
                                        content_type="application/json")


def _run_calls(run: int) -> dict[tuple[str, str], Callable[[APIClient], object]]:
    """The endpoints that reach one run by its id (its chunks and artifacts too)."""
    base = f"{API}/runs/{run}"
    calls: dict[tuple[str, str], Callable[[APIClient], object]] = {
        ("run-detail", "GET"): lambda c: c.get(f"{base}/"),
        ("run-artifacts", "GET"): lambda c: c.get(f"{base}/artifacts/"),
        ("run-artifact", "GET"): lambda c: c.get(f"{base}/artifacts/partial/"),
        ("run-artifact-download", "GET"): lambda c: c.get(f"{base}/artifacts/partial/download/"),
        ("run-step-chunks", "GET"): lambda c: c.get(f"{base}/steps/stream/chunks/"),
        ("run-step-chunk-stream", "GET"): lambda c: c.get(f"{base}/steps/stream/chunks/stream/"),
        ("run-artifact", "PUT"): lambda c: _json(c, "PUT", f"{base}/artifacts/note/",
                                                 {"content": "x", "kind": "text"}),
        ("run-artifact", "DELETE"): lambda c: c.delete(f"{base}/artifacts/note/"),
        ("run-signal", "POST"): lambda c: _json(c, "POST", f"{base}/signals/ping/"),
        ("run-pause", "POST"): lambda c: _json(c, "POST", f"{base}/pause/"),
        ("run-resume", "POST"): lambda c: _json(c, "POST", f"{base}/resume/"),
        ("run-retry", "POST"): lambda c: _json(c, "POST", f"{base}/retry/"),
        ("run-edit-state", "POST"): lambda c: _json(c, "POST", f"{base}/edit-state/",
                                                    {"patch": {"x": 1}, "reason": "tenants"}),
        ("run-input", "POST"): lambda c: _json(c, "POST", f"{base}/input/"),
        ("run-reject", "POST"): lambda c: _json(c, "POST", f"{base}/reject/"),
        ("run-approve", "POST"): lambda c: _json(c, "POST", f"{base}/approve/"),
        ("run-cancel", "POST"): lambda c: _json(c, "POST", f"{base}/cancel/"),
    }
    return calls


def _body(response) -> bytes:
    if getattr(response, "streaming", False):
        return b"".join(response.streaming_content)
    return response.content


class Leaks:
    """Every case checked, and those that leaked: the figure is the count, not the first."""

    def __init__(self) -> None:
        self.cases = 0
        self.leaks: list[str] = []

    def expect(self, case: str, ok: bool, detail: object = "") -> None:
        self.cases += 1
        if not ok:
            self.leaks.append(f"{case}: {detail}")

    def report(self, figures, what: str, **extra) -> None:
        figures.record(f"tenants: {what}", cases=self.cases, leaks=len(self.leaks),
                       mode="access-only" if ACCESS_ONLY else "RUN_SCOPE", **extra)
        assert not self.leaks, (f"{len(self.leaks)} leak(s) in {self.cases} cases:\n"
                                + "\n".join(self.leaks))


def _listed(response) -> set[int]:
    data = response.json()
    rows = data["results"] if isinstance(data, dict) else data
    return {row["id"] for row in rows}


def wait_until(predicate, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def _bulk_cases(api, me: Tenant, other: Tenant, name: str, before, expect, covered) -> None:
    """Bulk actions by filter: a filter reaches one's own runs only, counted alone, and
    another's operation is a 404."""
    covered |= {("run-bulk", "POST"), ("run-bulk-detail", "GET"), ("run-bulk-cancel", "POST")}
    body = {"action": "resume", "filter": {"workflow": name}}
    # RUN_SCOPE counts one's own in SQL; RUN_ACCESS alone is asked about each run, and a run
    # it hides is not counted (a count of them would tell that they exist).
    matched = 2
    dry = _json(api, "POST", f"{API}/runs/bulk/", {**body, "dry_run": True})
    expect(f"{me.name}: bulk dry run counts its own runs", dry.status_code == 200
           and dry.json()["matched"] == matched, (dry.status_code, dry.content[:160]))
    started = _json(api, "POST", f"{API}/runs/bulk/", body)
    expect(f"{me.name}: bulk resume counts its own runs", started.status_code == 202
           and started.json()["matched"] == matched, (started.status_code, started.content[:160]))
    if started.status_code == 202:  # the worker's pass (nothing is paused: no change) ends
        op_id = started.json()["id"]
        wait_until(lambda: BulkOperation.objects.get(pk=op_id).status == "done")
    # Processed here, where the tenancy settings apply (the session worker has none): every
    # chunk narrowed by the requesting user's scope.
    for action in ("pause", "resume"):
        op = BulkOperation.objects.create(action=action, filter={"workflow": name},
                                          requested_by=me.user, for_user=True,
                                          max_run_id=max(other.runs + me.runs))
        bulk_actions.process(op.pk)
        op.refresh_from_db()
        expect(f"{me.name}: bulk {action} acts on its own runs only",
               (op.status, op.acted) == ("done", 2) and footprint(other.runs) == before,
               (op.status, op.acted, op.skipped_reasons))
    theirs = BulkOperation.objects.create(action="cancel", filter={"workflow": name},
                                          requested_by=other.user, for_user=True,
                                          status=BulkOperation.DONE)
    for response in (api.get(f"{API}/runs/bulk/{theirs.pk}/"),
                     _json(api, "POST", f"{API}/runs/bulk/{theirs.pk}/cancel/")):
        expect(f"{me.name} -> {other.name}'s bulk operation", response.status_code == 404,
               response.status_code)


def test_api__every_endpoint_keeps_the_tenants_apart(world, figures):
    name, tenants = world
    a, b = tenants["a"], tenants["b"]
    covered: set[tuple[str | None, str]] = set()
    found = Leaks()
    expect = found.expect

    jobs = {tenant.name: int(job_tasks.for_tenant.enqueue(uuid.uuid4().hex[:8],
                                                         tenant=tenant.name).id)
            for tenant in (a, b)}
    for job in jobs.values():
        wait_for(job)
    with override_settings(QUEUETY=TENANCY):
        for me, other in ((a, b), (b, a)):
            api = client(me.user)
            # The jobs' endpoints: the other's job is a 404, one's own is answered, and the
            # list shows one's own jobs only.
            for key, suffix, method in ((("job-detail", "GET"), "", "GET"),
                                        (("job-retry", "POST"), "retry/", "POST"),
                                        (("job-cancel", "POST"), "cancel/", "POST")):
                covered.add(key)
                for whose, expected_missing in ((other, True), (me, False)):
                    response = _json(api, method, f"{API}/jobs/{jobs[whose.name]}/{suffix}") \
                        if method == "POST" else api.get(f"{API}/jobs/{jobs[whose.name]}/")
                    expect(f"{me.name} -> {whose.name}'s job: {key}",
                           (response.status_code == 404) == expected_missing
                           and response.status_code != 403,
                           f"{response.status_code} {_body(response)[:120]!r}")
            covered.add(("job-list", "GET"))
            listed = _listed(api.get(f"{API}/jobs/"))
            expect(f"{me.name}: GET jobs/", jobs[me.name] in listed
                   and jobs[other.name] not in listed, sorted(listed))
            before = footprint(other.runs)
            # Each endpoint that reaches a run by its id, on the other tenant's run: a 404.
            for key, call in _run_calls(other.runs[0]).items():
                covered.add(key)
                response = call(api)
                expect(f"{me.name} -> {other.name}'s run: {key}", response.status_code == 404,
                       f"{response.status_code} {_body(response)[:120]!r}")
            # Lists and their filters: never the other's rows, always one's own.
            covered.add(("run-list", "GET"))
            for query in ("", "?status=waiting_for_signal", f"?workflow={name}",
                          "?waiting=approval", "?waiting=true",
                          # one's job is a run too: a page of one's runs and it
                          f"?page_size={len(me.runs) + 1}"):
                listed = _listed(api.get(f"{API}/runs/{query}"))
                own = set(me.runs[:2] if "workflow=" in query else me.runs)
                expect(f"{me.name}: GET runs/{query}", not listed & set(other.runs)
                       and own <= listed, (sorted(listed & set(other.runs)), sorted(listed)))
            # The event log: the events of one's own runs, never the other's, whichever
            # filter (one naming the other's run included).
            covered.add(("event-list", "GET"))
            for query in ("", f"&workflow={name}", "&event=workflow_started",
                          f"&run={other.runs[0]}", "&since=1h"):
                rows = api.get(f"{API}/events/?page_size=500{query}").json()["results"]
                runs_seen = {row["run_id"] for row in rows}
                own = set() if "run=" in query else set(
                    me.runs[:2] if "workflow=" in query else me.runs)
                expect(f"{me.name}: GET events/{query}", not runs_seen & set(other.runs)
                       and own <= runs_seen, (sorted(runs_seen & set(other.runs)),
                                              sorted(own - runs_seen)))
            covered.add(("waits", "GET"))
            listed = _listed(api.get(f"{API}/waits/"))
            expect(f"{me.name}: GET waits/", not listed & set(other.runs)
                   and set(me.runs) <= listed, sorted(listed & set(other.runs)))
            # The other's idempotency key: never their run, and the same answer whether the
            # payload guessed theirs or not (else it would confirm the guess).
            covered.add(("run-list", "POST"))
            for guess in ({"tenant": other.name}, {"tenant": other.name, "x": 1}):
                response = _json(api, "POST", f"{API}/runs/", {
                    "workflow": "reg_approval", "payload": guess, "idempotency_key": other.key})
                expect(f"{me.name}: POST runs/ with {other.name}'s key, payload {guess}",
                       response.status_code == 409 and response.json() == {
                           "code": "idempotency_key_taken", "detail": f"Idempotency key "
                           f"{other.key!r} is already taken; nothing was dispatched. Use a "
                           "new key for a new run."}, (response.status_code, response.content))
            # A definition-wide pause and resume: one's own runs only, counted alone.
            definition = WorkflowRun.objects.get(pk=me.runs[0]).definition
            for action in ("pause", "resume"):
                covered.add((f"definition-{action}", "POST"))
                response = _json(api, "POST", f"{API}/workflows/{name}/definitions/"
                                              f"{definition.definition_hash}/{action}/")
                done = response.json().get("paused" if action == "pause" else "resumed")
                expect(f"{me.name}: {action} the shared definition", response.status_code == 200
                       and done == 2 and footprint(other.runs) == before,
                       f"{response.status_code} {done} runs")
                expect(f"{me.name}: {action} counts skipped runs of its own only",
                       sum(response.json().get("skipped", {}).values()) == 0,
                       response.json().get("skipped"))
            _bulk_cases(api, me, other, name, before, expect, covered)
            expect(f"{me.name}: nothing written to {other.name}'s runs",
                   footprint(other.runs) == before, footprint(other.runs))

        # Endpoints that hold no run: the same answer for everyone.
        for key, path in ((("workflows", "GET"), "/workflows/"), (("schema", "GET"), "/schema/"),
                          ((None, "GET"), "/runs/nothing-here/")):
            covered.add(key)
            for me in (a, b):
                response = client(me.user).get(API + path)
                expect(f"{me.name}: GET {path}", response.status_code == (404 if key[0] is None
                                                                          else 200))
        # Queues are site-wide: a tenant's numbers count its own runs' steps only (the
        # steps finished in the last 5 minutes), and only a superuser pauses or resumes.
        covered |= {("queue-list", "GET"), ("queue-pause", "POST"), ("queue-resume", "POST")}
        since = timezone.now() - timedelta(seconds=300)
        for me in (a, b):
            api = client(me.user)
            response = api.get(f"{API}/queues/")
            # A run's tenant is in its state (a job's: in its kwargs; tests.workflows.
            # tenant_scope). The site's count is larger: the answer is narrowed.
            finishes = Event.objects.filter(created_at__gte=since,
                                            kind__in=queues.FINISHED_KINDS)
            own = finishes.filter(Q(run__state__tenant=me.name)
                                  | Q(run__state__kwargs__tenant=me.name)).count()
            expect(f"{me.name}: other tenants' finished steps exist to hide",
                   finishes.count() > own > 0, (finishes.count(), own))
            if ACCESS_ONLY:  # a per-run check cannot narrow a count: superusers only
                expect(f"{me.name}: GET queues/ is for superusers under RUN_ACCESS",
                       response.status_code == 403, response.status_code)
            else:
                finished = sum(item["finished"] for item in response.json())
                expect(f"{me.name}: GET queues/ counts its own runs' steps only",
                       response.status_code == 200 and finished == own, (finished, own))
            for action in ("pause", "resume"):
                response = _json(api, "POST", f"{API}/queues/tenant-probe/{action}/")
                expect(f"{me.name}: POST queues/<name>/{action}/ is for superusers",
                       response.status_code == 403
                       and not QueuePause.objects.filter(queue="tenant-probe").exists(),
                       response.status_code)
        # An approval link is its own authority (signed, single-use, for one wait): whoever
        # holds it may open it, signed in or not, any tenant. A forged one is refused.
        covered |= {("approval-page", "GET"), ("approval-page", "POST")}
        expect("link: opened by its holder", Client().get(b.link).status_code == 200)
        expect("link: forged", Client().post(f"{API}/approvals/not-a-token/",
                                             {"action": "approve"}).status_code == 403)

        # An inbound hook is authenticated by the provider's signature, not by a user: a
        # tenant's session gives it nothing; unsigned, it is refused and stores nothing.
        covered.add(("inbound-hook", "POST"))
        for me in (a, b):
            response = _json(client(me.user), "POST", f"{API}/hooks/no-such-hook/", {"id": 1})
            expect(f"{me.name}: POST an undeclared hook", response.status_code == 404,
                   response.status_code)

        # One's own runs: every endpoint answers (a 409 for a status that does not allow
        # it is an answer, not a refusal).
        for me in (a, b):
            api = client(me.user)
            for key, call in _run_calls(me.runs[0]).items():
                response = call(api)
                expect(f"{me.name} -> own run: {key}", response.status_code not in (403, 404),
                       f"{response.status_code} {_body(response)[:160]!r}")

    missing = endpoints() - covered
    assert not missing, f"endpoints the tenant matrix does not call: {sorted(missing, key=str)}"
    found.report(figures, "API matrix", endpoints=len(endpoints()))


@pytest.mark.skipif(ACCESS_ONLY, reason="RUN_SCOPE is what is measured")
def test_api__the_scope_is_part_of_each_query_not_a_statement_more(world, figures):
    name, tenants = world
    a = tenants["a"]
    api = client(a.user)
    counts: dict[str, dict[str, int]] = {}
    for path in (f"runs/{a.runs[1]}/", f"runs/{a.runs[1]}/artifacts/", f"runs/?workflow={name}",
                 "waits/"):
        api.get(f"{API}/{path}")  # warm: permissions, definitions and settings read once
        for mode, values in (("off", TEST_QUEUETY), ("on", TENANCY)):
            with override_settings(QUEUETY=values), CaptureQueriesContext(connection) as seen:
                assert api.get(f"{API}/{path}").status_code == 200
            counts.setdefault(path, {})[mode] = len(seen)
    assert all(each["on"] == each["off"] for each in counts.values()), counts
    figures.record("tenants: statements per API call, scope off / on", **{
        path: f"{each['off']} / {each['on']}" for path, each in counts.items()})


# -- the admin ----------------------------------------------------------------------------------

def _statuses(tenant: Tenant, definition: int | None = None) -> dict[str, set[int]]:
    """The tenant's runs (of ``definition``) by status, as they are now."""
    found: dict[str, set[int]] = {"waiting_for_signal": set()}
    runs = WorkflowRun.objects.filter(pk__in=tenant.runs)
    if definition is not None:
        runs = runs.filter(definition_id=definition)
    for pk, status in runs.values_list("pk", "status"):
        found.setdefault(status, set()).add(pk)
    return {status: ids for status, ids in found.items() if ids}


def admin_client(user: User) -> Client:
    browser = Client()
    browser.force_login(user)
    return browser


def _changelist_ids(response) -> set[int]:
    return {run.pk for run in response.context["cl"].result_list}


def test_admin__lists_pages_counts_and_bulk_actions_keep_the_tenants_apart(world, figures):
    name, tenants = world
    a, b = tenants["a"], tenants["b"]
    endpoint = WebhookEndpoint.objects.create(url="https://hooks.example.com/t", secret="s" * 20,
                                              events=["run.failed"], active=False)
    deliveries = {t.name: WebhookDelivery.objects.create(
        endpoint=endpoint, event="run.failed", event_id=uuid.uuid4(), run_id=t.runs[0],
        payload={"tenant": t.name}, status=WebhookDelivery.FAILED,
        next_attempt_at=timezone.now()).pk for t in (a, b)}
    found = Leaks()
    expect = found.expect

    try:
        with override_settings(QUEUETY=TENANCY):
            for me, other in ((a, b), (b, a)):
                browser = admin_client(me.user)
                before = footprint(other.runs)
                runs = f"{ADMIN}/workflowrun/"
                for query in ("", f"?workflow={name}", "?status__exact=waiting_for_signal",
                              f"?q={other.runs[0]}", f"?q={name}"):
                    shown = _changelist_ids(browser.get(runs + query))
                    expect(f"{me.name}: runs changelist {query}", not shown & set(other.runs),
                           sorted(shown & set(other.runs)))
                shown = _changelist_ids(browser.get(runs + f"?workflow={name}"))
                expect(f"{me.name}: own runs listed", set(me.runs[:2]) <= shown, shown)
                response = browser.get(f"{runs}approvals/")
                shown = {row["run"].pk for row in response.context["rows"]}
                expect(f"{me.name}: approvals page", not shown & set(other.runs)
                       and _statuses(me)["waiting_for_signal"] <= shown,
                       sorted(shown & set(other.runs)))
                # The other's run page answers as for a run that does not exist.
                response = browser.get(f"{runs}{other.runs[0]}/change/", follow=True)
                expect(f"{me.name}: other's run page", response.redirect_chain and
                       "does not exist" in response.content.decode(), response.redirect_chain)
                for page in (f"{other.runs[0]}/export/", f"{other.runs[0]}/artifacts/partial/",
                             f"{other.runs[0]}/chunks/{other.stream_row}/",
                             f"{other.runs[0]}/edit-state/"):
                    status = browser.get(runs + page).status_code
                    expect(f"{me.name}: other's {page}", status == 404, status)
                status = browser.post(f"{runs}{other.runs[0]}/edit-state/", {
                    "state": "{}", "reason": "r", "revision": "0", "save": "1"}).status_code
                expect(f"{me.name}: edit other's state", status == 404, status)
                response = browser.post(f"{runs}{other.runs[0]}/act/pause/",
                                        {"revision": "0"}, follow=True)
                expect(f"{me.name}: action on other's run", "does not exist" in
                       response.content.decode(), response.status_code)
                # A bulk action whose selection names the other's runs: they are not in
                # the changelist's queryset, so it touches none of them.
                browser.post(runs, {"action": "pause_selected",
                                    "_selected_action": [*other.runs, me.runs[1]]})
                expect(f"{me.name}: bulk pause", footprint(other.runs) == before,
                       footprint(other.runs))
                browser.post(runs, {"action": "resume_selected",
                                    "_selected_action": [me.runs[1]]})
                # "Start a run" with the other's idempotency key: one answer, no run named.
                for guess in ({"tenant": other.name}, {"tenant": other.name, "x": 1}):
                    response = browser.post(f"{runs}start/reg_approval/", {
                        "payload": json.dumps(guess), "idempotency_key": other.key})
                    expect(f"{me.name}: start with {other.name}'s key, payload {guess}",
                           response.status_code == 400 and "is already taken" in
                           response.content.decode() and "already started run" not in
                           response.content.decode(), response.status_code)
                # The definitions' counts: one's own runs only.
                response = browser.get(f"{ADMIN}/workflowdefinition/?q={name}")
                counts = {d.pk: d.run_counts for d in response.context["cl"].result_list}
                definition = WorkflowRun.objects.get(pk=me.runs[0]).definition_id
                own = {status: len(ids) for status, ids in _statuses(me, definition).items()}
                expect(f"{me.name}: definition run counts", counts == {definition: own},
                       (counts, own))
                page = browser.get(f"{ADMIN}/workflowdefinition/{definition}/change/")
                expect(f"{me.name}: definition page", page.status_code == 200 and
                       f"?definition={definition}" in page.content.decode())
                for query in ("", f"?workflow={name}", f"?q={other.runs[0]}"):
                    shown = {row.run_id for row in browser.get(
                        f"{ADMIN}/event/{query}").context["cl"].result_list}
                    expect(f"{me.name}: events list {query}", not shown & set(other.runs)
                           and (bool(shown) or "q=" in query), sorted(shown))
                response = browser.get(f"{ADMIN}/webhookdelivery/")
                shown = {row.pk for row in response.context["cl"].result_list}
                expect(f"{me.name}: delivery log", deliveries[me.name] in shown
                       and deliveries[other.name] not in shown, shown)
                status = browser.get(f"{ADMIN}/webhookdelivery/{deliveries[other.name]}/"
                                     "change/", follow=True).redirect_chain
                expect(f"{me.name}: other's delivery page", bool(status), status)
                # The queues page applies the API's rule (queuety.queues.may_see, may_act):
                # under RUN_ACCESS alone, no numbers for non-superusers; no pause for them.
                status = browser.get(f"{ADMIN}/queuepause/").status_code
                expect(f"{me.name}: queues page", status == (403 if ACCESS_ONLY else 200),
                       status)
                status = browser.post(f"{ADMIN}/queuepause/", {
                    "queue": "tenant-probe", "action": "pause"}).status_code
                expect(f"{me.name}: queues page pause", status == 403 and not
                       QueuePause.objects.filter(queue="tenant-probe").exists(), status)
                # One's own run page, export and chunks are there.
                for page in (f"{me.runs[0]}/change/", f"{me.runs[0]}/export/",
                             f"{me.runs[0]}/artifacts/partial/", f"{me.runs[0]}/edit-state/",
                             f"{me.runs[0]}/chunks/{me.stream_row}/"):
                    status = browser.get(runs + page).status_code
                    expect(f"{me.name}: own {page}", status == 200, status)
                expect(f"{me.name}: nothing written to {other.name}'s runs",
                       footprint(other.runs) == before, footprint(other.runs))
    finally:
        endpoint.delete()
    found.report(figures, "admin pages")


@pytest.mark.skipif(ACCESS_ONLY, reason="the tag filter's choices come from RUN_SCOPE's query")
def test_admin__the_tag_filter_offers_only_the_users_own_tags(world):
    # The sidebar's choices are the tags of the newest runs the user may see: another
    # tenant's tag value never shows, not even as a choice that would match nothing.
    name, tenants = world
    flow = queuety.workflow(f"{name}_tagged").then("tests.tag_steps.plain")
    secrets = {t: f"{t}-{uuid.uuid4().hex[:8]}" for t in tenants}
    for run_id in [flow.dispatch({"tenant": t}, tags={"secret": secrets[t]}) for t in tenants]:
        wait_for(run_id)
    with override_settings(QUEUETY=TENANCY):
        for me, other in (("a", "b"), ("b", "a")):
            page = admin_client(tenants[me].user).get(f"{ADMIN}/workflowrun/")
            html = page.content.decode()
            assert page.status_code == 200 and f"secret:{secrets[me]}" in html
            assert secrets[other] not in html


# -- the CLI ----------------------------------------------------------------------------------

def cli(*args: str) -> str:
    out = StringIO()
    call_command("queuety", "workflow", *args, stdout=out)
    return out.getvalue()


@pytest.mark.skipif(ACCESS_ONLY, reason="--as-user is new with RUN_SCOPE")
def test_cli__as_user_acts_inside_the_users_scope(world):
    name, tenants = world
    a, b = tenants["a"], tenants["b"]
    with override_settings(QUEUETY=TENANCY):
        before = footprint(b.runs)
        for args in (("status", str(b.runs[0])), ("timeline", str(b.runs[0])),
                     ("export", str(b.runs[0])), ("artifacts", str(b.runs[0])),
                     ("chunks", str(b.runs[0]), "stream"), ("pause", str(b.runs[0])),
                     ("approve", str(b.runs[0])),
                     ("edit-state", str(b.runs[0]), "--patch", '{"x": 1}', "--reason", "r"),
                     ("retry", str(b.runs[0]), "--from-step", "0")):
            with pytest.raises(CommandError, match=f"Workflow #{b.runs[0]} not found"):
                cli(*args, "--as-user", a.user.username)
        listed = {row["id"] for row in json.loads(cli("list", "--format", "json", "--limit",
                                                      "500", "--as-user", a.user.username))}
        assert set(a.runs) <= listed and not listed & set(b.runs)
        definition = WorkflowRun.objects.get(pk=a.runs[0]).definition
        live = len(_statuses(a, definition.pk).get("waiting_for_signal", ()))
        paused = json.loads(cli("pause", "--definition", definition.definition_hash,
                                "--format", "json", "--as-user", a.user.username))
        assert live and paused["paused"] == live and footprint(b.runs) == before
        cli("resume", "--definition", definition.definition_hash, "--as-user",
            a.user.username)
        assert footprint(b.runs) == before
        # The event log: a's events only, whichever filter; none of b's run named outright.
        for extra in ((), ("--workflow", name), ("--run", str(b.runs[0]))):
            out = StringIO()
            call_command("queuety", "log", "--json", "--limit", "10000", *extra,
                         "--as-user", a.user.username, stdout=out)
            seen = {json.loads(line)["run_id"] for line in out.getvalue().splitlines()}
            assert not seen & set(b.runs), (extra, sorted(seen & set(b.runs)))
            assert "--run" in extra or set(a.runs[:2]) <= seen, (extra, sorted(seen))
        # Without --as-user the command is the operator's, with full access.
        assert str(b.runs[0]) in cli("status", str(b.runs[0]), "--format", "json")
        with pytest.raises(CommandError, match="No user is named 'nobody-"):
            cli("list", "--as-user", f"nobody-{uuid.uuid4().hex[:6]}")
        with pytest.raises(CommandError):  # a subcommand that takes no --as-user refuses it
            cli("definitions", "--as-user", a.user.username)
