"""The workflow graph on the admin's definition page and run page, through Django's test
client against PostgreSQL and a real worker: the SVG is on the page with a node per step, and
on the run page each step's status, its attempts and the path the run took."""

from __future__ import annotations

import re
import time
import uuid
import xml.etree.ElementTree as ET

import pytest
from django.contrib.auth.models import User
from django.test import Client

import queuety
from queuety.models import StepRun, WorkflowDefinition, WorkflowRun
from tests import workflows
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.worker

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def boss() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser(f"g{uuid.uuid4().hex[:10]}", "", "pw"))
    return client


def graph_of(html: str) -> ET.Element:
    """The page's workflow graph, parsed (the first ``q-graph`` SVG after the legend)."""
    found = re.findall(r'<svg xmlns="http://www.w3.org/2000/svg" class="q-graph" .*?</svg>',
                       html, re.S)
    assert len(found) == 1, "the page has no workflow graph, or more than one"
    return ET.fromstring(found[0])


def nodes(svg: ET.Element) -> dict[str, dict[str, str]]:
    return {g.get("data-step"): dict(g.attrib) for g in svg.iter(f"{SVG}g")
            if g.get("data-step")}


def taken(svg: ET.Element) -> set[tuple[str, str]]:
    return {(g.get("data-source"), g.get("data-target")) for g in svg.iter(f"{SVG}g")
            if "q-taken" in (g.get("class") or "")}


def routed(token: str) -> queuety.WorkflowBuilder:
    return (queuety.workflow(f"graph_{token}")
            .then(workflows.step_a, name="first")
            .route(workflows.classify, {"left": "left", "right": "right"}, name="choose")
            .then(workflows.step_b, name="left")
            .then(workflows.step_c, name="right")
            .wait_for_signal("go", name="hold"))


def test_definition_page__draws_every_step_and_route(boss, token):
    run_id = routed(token).dispatch({"token": token, "label": "right"})
    definition = WorkflowRun.objects.get(pk=run_id).definition_id

    html = boss.get(f"/admin/queuety/workflowdefinition/{definition}/change/").content.decode()

    svg = graph_of(html)
    assert 'id="workflow-graph"' in html and "q-legend" in html
    assert list(nodes(svg)) == ["first", "choose", "left", "right", "hold"]
    assert nodes(svg)["choose"]["class"] == "q-node q-kind-route"
    assert nodes(svg)["hold"]["class"] == "q-node q-kind-wait"
    edges = {(g.get("data-source"), g.get("data-target")): "".join(g.itertext())
             for g in svg.iter(f"{SVG}g") if g.get("data-source")}
    assert edges[("s1", "s2")] == "left" and edges[("s1", "s3")] == "right"
    assert not taken(svg) and "data-status" not in html  # a definition has no run's path


def test_run_page__statuses_attempts_and_the_path_taken(boss, worker, token):
    run_id = routed(token).dispatch({"token": token, "label": "right"})
    wait_for(run_id, ("waiting_for_signal",))

    html = boss.get(f"/admin/queuety/workflowrun/{run_id}/change/").content.decode()

    svg = graph_of(html)
    states = {name: (node.get("data-status"), node.get("data-attempts"))
              for name, node in nodes(svg).items()}
    assert states == {"first": ("done", "1"), "choose": ("done", "1"),
                      "left": ("skipped", "0"), "right": ("done", "1"),
                      "hold": ("waiting", "0")}
    assert taken(svg) == {("start", "s0"), ("s0", "s1"), ("s1", "s3"), ("s3", "s4")}

    queuety.signal(run_id, "go")
    wait_for(run_id)
    svg = graph_of(boss.get(f"/admin/queuety/workflowrun/{run_id}/change/").content.decode())
    assert nodes(svg)["hold"]["data-status"] == "done"
    assert ("s4", "end") in taken(svg)


def test_run_page__a_failed_step_shows_its_attempts(boss, worker, token):
    run_id = (queuety.workflow(f"graph_fail_{token}")
              .then(workflows.step_a, name="ok")
              .then(workflows.boom, name="explodes",
                    retry=queuety.RetryPolicy(max_attempts=2, initial_delay=0, jitter=0))
              .then(workflows.step_c, name="never")
              .dispatch({"token": token}))
    wait_for(run_id)

    svg = graph_of(boss.get(f"/admin/queuety/workflowrun/{run_id}/change/").content.decode())

    explodes = nodes(svg)["explodes"]
    assert (explodes["data-status"], explodes["data-attempts"]) == ("failed", "2")
    assert "failed · 2 attempts" in "".join(
        next(g for g in svg.iter(f"{SVG}g") if g.get("data-step") == "explodes").itertext())
    assert "data-status" not in nodes(svg)["never"]  # not reached
    assert ("s2", "end") not in taken(svg) and ("s0", "s1") in taken(svg)


def test_hostile_step_names_are_escaped_on_both_pages(boss, token):
    hostile = f"<script>alert('{token}')</script>"
    run_id = (queuety.workflow(f"graph_x_{token}").then(workflows.step_a, name=hostile)
              .wait_for_signal("go").dispatch({"token": token}))
    definition = WorkflowDefinition.objects.get(name=f"graph_x_{token}")
    for url in (f"/admin/queuety/workflowdefinition/{definition.pk}/change/",
                f"/admin/queuety/workflowrun/{run_id}/change/"):
        html = boss.get(url).content.decode()
        assert hostile not in html, url
        assert nodes(graph_of(html))[hostile]["data-node"] == "s0"


def test_run_page__a_cancelled_runs_compensation_is_done(boss, worker, token):
    run_id = (queuety.workflow(f"graph_undo_{token}")
              .then(workflows.step_a, name="book").compensate_with(workflows.undo)
              .wait_for_signal("go", name="hold").dispatch({"token": token}))
    wait_for(run_id, ("waiting_for_signal",))
    queuety.cancel(run_id)
    wait_for(run_id, ("cancelled",))
    deadline = time.monotonic() + 30
    while not StepRun.objects.filter(run_id=run_id, kind="compensation",
                                     status="completed").exists():
        assert time.monotonic() < deadline, "the compensation never ran"
        time.sleep(0.1)

    svg = graph_of(boss.get(f"/admin/queuety/workflowrun/{run_id}/change/").content.decode())

    undo = next(g for g in svg.iter(f"{SVG}g") if g.get("data-node") == "s0c")
    assert undo.get("data-status") == "done" and "q-status-done" in undo.get("class")
    assert nodes(svg)["book"]["data-status"] == "done"
