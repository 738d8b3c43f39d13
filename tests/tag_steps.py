"""Steps of the run tags' tests (tests/integration/test_tags.py): the worker imports them by
dotted path."""

from __future__ import annotations


def plain(state):
    return {"plain": True}


def tags_plan(state, context):
    """Tags the run with the plan its state names, and with ``stage=tagged`` (which replaces a
    ``stage`` tag given at dispatch)."""
    context.tag("plan", state.get("plan", "free"))
    context.tag("stage", "tagged")
    return {"tagged": True}


def tags_then_fails_once(state, context):
    """Its first attempt tags ``doomed`` and fails; the retry tags ``attempt=2`` and succeeds:
    only the second attempt's tag may reach the run."""
    if context.attempt == 1:
        context.tag("doomed", "yes")
        raise RuntimeError("first attempt fails after tagging")
    context.tag("attempt", str(context.attempt))
    return {"ok": True}


def bad_tag(state, context):
    context.tag("has:colon", "x")
    return {}


def tags_twenty(state, context):
    """Sets 20 tags (``step0`` ... ``step19``): with 20 from the dispatch, a run of 40."""
    for n in range(20):
        context.tag(f"step{n}", "x")
    return {}
