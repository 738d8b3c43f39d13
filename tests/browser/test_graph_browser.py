"""In headless Chromium: the workflow graph on the definition page and the run page is drawn
(server-side SVG, no script), readable (at full size: the page scrolls, the text is not
shrunk) and carries the run's statuses; saves docs/guide/admin.md's graph screenshots."""

from __future__ import annotations

import json

import pytest

from tests.browser.conftest import SCREENSHOTS
from tests.browser.test_admin_browser import log_in

DEFINITIONS = "/admin/queuety/workflowdefinition/"
RUNS = "/admin/queuety/workflowrun/"
GRAPH = "svg.q-graph:not(.q-legend)"
REVIEW_STEPS = ["reserve_stock", "assess_risk", "manual_review", "charge_card", "notify",
                "pack_parcels", "check_tracking", "until_delivered", "survey", "await_feedback"]


@pytest.fixture(scope="module")
def made(site):
    return json.loads(site.shell("from tests.browser.graph_steps import seed; seed()")
                      .strip().splitlines()[-1])


def steps_of(page) -> dict[str, dict[str, str | None]]:
    """The graph's step nodes, in order: name -> status, attempts and text."""
    steps = {}
    for node in page.locator(f"{GRAPH} g.q-node[data-step]").all():
        steps[node.get_attribute("data-step")] = {
            "status": node.get_attribute("data-status"),
            "attempts": node.get_attribute("data-attempts"), "text": node.text_content()}
    return steps


def assert_readable(page) -> None:
    """Drawn at 100 %: a node is as wide on screen as in the SVG, its name 12 px."""
    graph = page.locator(GRAPH)
    assert graph.is_visible()
    box = graph.bounding_box()
    assert box is not None and box["width"] == float(graph.get_attribute("width"))
    name = page.locator(f"{GRAPH} .q-name").first
    assert name.evaluate("t => getComputedStyle(t).fontSize") == "12px"
    assert name.bounding_box()["height"] >= 10


def test_definition_page_draws_the_workflow(site, page, made):
    log_in(page, site, f"{DEFINITIONS}{made['review_definition']}/change/")
    assert_readable(page)
    assert list(steps_of(page)) == REVIEW_STEPS
    kinds = {page.locator(f"{GRAPH} g[data-step='{name}']").get_attribute("class")
             for name in ("assess_risk", "manual_review", "notify", "pack_parcels",
                          "until_delivered", "survey")}
    assert kinds == {f"q-node q-kind-{k}" for k in ("route", "wait", "parallel", "for_each",
                                                    "repeat", "child")}
    assert page.locator(f"{GRAPH} g.q-kind-branch").count() == 2
    assert page.locator(f"{GRAPH} g.q-kind-compensation").count() == 2
    assert page.locator(f"{GRAPH} g.q-edge-loop").count() == 1
    assert page.locator("script[src]").evaluate_all(  # nothing from another host
        "scripts => scripts.filter(s => !s.src.startsWith(location.origin)).length") == 0
    page.locator("#workflow-graph summary").click()  # collapsible
    assert not page.locator(GRAPH).is_visible()
    page.locator("#workflow-graph summary").click()
    page.set_viewport_size({"width": 1920, "height": 1700})  # the whole graph in the picture
    page.locator("#workflow-graph").scroll_into_view_if_needed()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.locator("#workflow-graph").screenshot(path=str(SCREENSHOTS / "graph-definition.png"))


def test_fifty_steps_stay_readable_and_the_graph_scrolls(site, page, made):
    log_in(page, site, f"{DEFINITIONS}{made['long_definition']}/change/")
    assert_readable(page)
    assert len(steps_of(page)) == 50
    scroller = page.locator("#workflow-graph .q-graph-scroll")
    assert scroller.evaluate("s => s.scrollHeight > s.clientHeight")
    last = page.locator(f"{GRAPH} g[data-step='step_49']")
    last.scroll_into_view_if_needed()
    assert last.is_visible() and abs(last.bounding_box()["width"] - 240) < 3  # its stroke


def test_run_page_draws_the_path_statuses_and_attempts(site, page, made):
    log_in(page, site, f"{RUNS}{made['review']}/change/")
    assert_readable(page)
    steps = steps_of(page)
    assert list(steps) == REVIEW_STEPS
    assert {name: step["status"] for name, step in steps.items()} == {
        **{name: "done" for name in REVIEW_STEPS}, "manual_review": "skipped",
        "await_feedback": "waiting"}
    assert steps["charge_card"]["attempts"] == "2"
    assert "done · 2 attempts" in steps["charge_card"]["text"]
    assert "2 visits" in steps["check_tracking"]["text"]
    assert "3/3 items done" in steps["pack_parcels"]["text"]
    taken = {(edge.get_attribute("data-source"), edge.get_attribute("data-target"))
             for edge in page.locator(f"{GRAPH} g.q-edge.q-taken").all()}
    assert ("s1", "s3") in taken and ("s1", "s2") not in taken  # the low-risk route
    assert ("s7", "s6") in taken  # the tracking loop went round once
    stroke = page.locator(f"{GRAPH} g.q-edge.q-taken path").first.evaluate(
        "p => getComputedStyle(p).strokeWidth")
    assert stroke == "3px"
    page.set_viewport_size({"width": 1920, "height": 1700})  # the whole graph in the picture
    page.locator("#graph").scroll_into_view_if_needed()
    page.locator("#graph").screenshot(path=str(SCREENSHOTS / "graph-run.png"))
