"""Workflows registered by an installed app (found by ``QueuetyConfig.ready()``)."""

import queuety
from tests import keyed_steps
from tests import workflows as steps


@queuety.register("reg_letters")
def letters():
    """Appends a, b and c to the log.

    The rest of the docstring is not the description.
    """
    return queuety.workflow("reg_letters").version("v2").then(steps.step_a).then(steps.step_b) \
        .then(steps.step_c)


# A builder registered directly, with a small state budget for the bad-input tests.
queuety.register("reg_small", queuety.workflow("reg_small").max_state_bytes(200)
                 .then(steps.step_a))


@queuety.register("reg_approval")
def approval():
    """Waits for an approval, then appends b."""
    return queuety.workflow("reg_approval").wait_for_approval().then(steps.step_b)


@queuety.register("reg_flaky")
def flaky():
    """Fails its first attempts (state fail_times), retried with long back-offs."""
    return queuety.workflow("reg_flaky").then(
        steps.flaky, retry=queuety.RetryPolicy(max_attempts=4, initial_delay=60))


@queuety.register("reg_parent")
def parent():
    """Runs reg_letters' steps as a child run, then appends c."""
    child = queuety.workflow("reg_parent_child").then(steps.step_a)
    return queuety.workflow("reg_parent").run_workflow("child", child).then(steps.step_c)


# An inbound hook declared as a site declares one, found by the same autodiscovery
# (tests/integration/test_inbound_hooks.py).
queuety.inbound("testapp-github", verify=queuety.verifiers.github("testapp-hook-secret-0123"),
                start="reg_letters")


# A model trigger declared as a site declares one (tests/integration/test_triggers.py): it
# fires only for the rows that test marks, so the other trigger tests' saves pass it by.
queuety.trigger("queuety_testapp.Article", on="created", start="reg_letters",
                name="autodiscovered", when=lambda article: article.status == "autodiscover",
                payload=lambda article: {"token": article.token})
# Keyed runs started through the REST API (tests/integration/test_keyed_runs.py).
queuety.register("reg_keyed_gate", keyed_steps.gated("reg_keyed_gate"))
