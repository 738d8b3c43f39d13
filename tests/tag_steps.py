"""Steps of the run tags' tests (tests/integration/test_tags.py): the worker imports them by
dotted path."""

from __future__ import annotations


def plain(state):
    return {"plain": True}


def tags_plan(state, context):
    """Tags the run with the plan its state names (and overrides the dispatch's ``stage``)."""
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
