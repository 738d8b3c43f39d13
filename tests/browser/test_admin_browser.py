"""End to end in headless Chromium: an operator logs in to the admin, opens a run waiting for
approval, approves it, and watches it complete, saving docs/guide/admin.md's screenshots."""

from __future__ import annotations

import re
import time

from tests.browser.conftest import SCREENSHOTS
from tests.browser.seed import PASSWORD, USERNAME

RUNS = "/admin/queuety/workflowrun/"


def log_in(page, site, then: str) -> None:
    page.goto(site.url(f"/admin/login/?next={then}"))
    page.fill("#id_username", USERNAME)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(re.compile(re.escape(then) + "$"))


def status_block(page) -> str:
    return page.inner_text("#status-block")


def test_operator_approves_a_waiting_run_and_sees_it_complete(site, page):
    waiting = site.runs["waiting"]
    log_in(page, site, RUNS)

    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 9
    row = page.locator("#result_list tbody tr", has=page.locator(
        f"a[href='{RUNS}{waiting}/change/']"))
    assert "waiting_for_signal" in row.inner_text()
    assert "approval (a person)" in row.inner_text()
    assert "editorial.v2" in row.inner_text() and "article:7" in row.inner_text()
    page.click("#toggle-nav-sidebar")  # more room for the table (remembered by the browser)
    page.goto(site.url(RUNS))
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(SCREENSHOTS / "changelist.png"))

    row.locator(f"a[href='{RUNS}{waiting}/change/']").click()
    page.wait_for_url(f"**{RUNS}{waiting}/change/")
    assert "Status:   waiting_for_signal" in status_block(page)
    assert "StepName: wait_for_approval" in status_block(page)
    assert "transitions" in page.inner_text("#budgets")
    page.screenshot(path=str(SCREENSHOTS / "run-page.png"), full_page=True)

    page.fill("#note", "Ready to publish.")
    page.click("#action-approve")
    page.wait_for_url(f"**{RUNS}{waiting}/change/")
    assert f"Run {waiting} was approved" in page.inner_text(".messagelist")

    deadline = time.monotonic() + 30
    while "Status:   completed" not in status_block(page):
        assert time.monotonic() < deadline, status_block(page)
        time.sleep(0.3)
        page.reload()
    timeline = page.inner_text("#timeline")
    assert f"admin:{USERNAME}" in timeline and "workflow_completed" in timeline
    assert "published_url" in page.inner_text("#state")
    assert page.locator("#actions button").count() == 0  # a completed run offers no action


def test_approvals_page_lists_the_person_waits_and_the_input_form_follows_the_schema(site,
                                                                                    page):
    log_in(page, site, f"{RUNS}approvals/")
    table = page.inner_text("#approvals")
    assert "expense_claim" in table and "input" in table
    assert "refund_request" in table and "decision" in table
    assert "payment_reconciliation" not in table  # waits for a signal, not a person
    page.screenshot(path=str(SCREENSHOTS / "approvals.png"))

    page.click(f"#approval-{site.runs['input']} a.button")
    page.wait_for_url(f"**{RUNS}{site.runs['input']}/change/**")
    page.select_option("#f-decision", "approve")
    page.fill("#f-amount", "120")
    page.click("#action-input")
    assert (f"Your input was sent to run {site.runs['input']}"
            in page.inner_text(".messagelist"))


def test_definitions_page_counts_runs_per_status(site, page):
    log_in(page, site, "/admin/queuety/workflowdefinition/")
    row = page.locator("#result_list tbody tr", has_text="order_fulfilment")
    assert "orders.v3" in row.inner_text() and "completed 3" in row.inner_text()
    page.screenshot(path=str(SCREENSHOTS / "definitions.png"))
    row.locator("a", has_text="completed").click()
    page.wait_for_url(re.compile(r"status__exact=completed"))
    assert page.locator("#result_list tbody tr").count() == 3


def breadcrumb_bar(page) -> tuple[str, str]:
    """The text and background colour of the page's breadcrumb bar."""
    bar = page.locator("nav[aria-label='Breadcrumbs'] .breadcrumbs")
    assert bar.count() == 1
    return bar.inner_text(), bar.evaluate("bar => getComputedStyle(bar).backgroundColor")


def test_run_page_and_approvals_page_render_the_admins_breadcrumb_bar(site, page):
    # Django's own changelist is the reference: the same bar, styled by the same CSS, on the
    # Django version this runs on (5.2, 6.0; 6.1 changed its markup to an <ol>).
    log_in(page, site, RUNS)
    text, reference = breadcrumb_bar(page)
    assert text.startswith("Home") and reference not in ("rgba(0, 0, 0, 0)", "transparent")

    waiting = site.runs["waiting"]
    page.goto(site.url(f"{RUNS}{waiting}/change/"))
    text, colour = breadcrumb_bar(page)
    assert re.fullmatch(r"Home\W+Queuety workflows\W+Workflow runs\W+#" + str(waiting), text)
    assert colour == reference
    assert page.locator(".breadcrumbs a[href='/admin/queuety/']").count() == 1

    page.goto(site.url(f"{RUNS}approvals/"))
    text, colour = breadcrumb_bar(page)
    assert re.fullmatch(r"Home\W+Queuety workflows\W+Workflow runs\W+Waiting on a person", text)
    assert colour == reference
