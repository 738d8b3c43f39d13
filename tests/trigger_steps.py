"""Steps of the model-trigger tests (tests/integration/test_triggers.py); the worker imports
them by dotted path."""

from __future__ import annotations

from typing import Any


def look_up(state: dict[str, Any]) -> dict[str, Any]:
    """Record whether the triggering row exists as the step runs, and its title."""
    from tests.testapp.models import Article

    found = Article.objects.filter(pk=state["pk"]).first()
    return {"row_exists": found is not None, "title": found.title if found else None}
