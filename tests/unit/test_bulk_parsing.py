"""The pure parts of bulk actions: ages as the API and the CLI take them, refusals counted by
their gist, the REST filter's translation and the checks that record nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest

from queuety import bulk_actions, queries
from queuety.api.bulk import filter_of


@pytest.mark.parametrize(("text", "seconds"), [
    ("7d", 7 * 86400), ("12h", 12 * 3600), ("90m", 5400), ("45s", 45), ("30", 30),
    ("2w", 14 * 86400), ("1.5h", 5400), (" 3D ", 3 * 86400), ("0s", 0)])
def test_parse_age__a_number_with_an_optional_unit(text, seconds):
    assert queries.parse_age(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "d", "soon", "-1d", "7y", "nan", "inf", "1e400"])
def test_parse_age__anything_else_is_refused_saying_what_is_accepted(text):
    with pytest.raises(ValueError, match="give a number of seconds or a number with a unit"):
        queries.parse_age(text)


def test_gist__the_reason_without_the_run_id():
    assert bulk_actions.gist("Cannot cancel workflow run 7: it is already completed.") == \
        "it is already completed"
    assert bulk_actions.gist("Cannot retry workflow run 12345: it is paused, not failed.") == \
        "it is paused, not failed"
    assert bulk_actions.gist("no colon here.") == "no colon here"


def test_rest_filter__query_keys_to_bulk_keys():
    assert filter_of({"workflow": "orders", "older_than": "7d", "tag": ["region:eu", "a:b:c"],
                      "definition": 12}) == {
        "workflow": "orders", "definition": "12", "older_than": timedelta(days=7),
        "tags": {"region": "eu", "a": "b:c"}}
    assert filter_of({"tag": "k:v"}) == {"tags": {"k": "v"}}


@pytest.mark.parametrize(("query", "message"), [
    ({"colour": "red"}, "Unknown filter key"),
    ({"tag": ["novalue"]}, "must be key:value"),
    ({"status": ["a"]}, "must be a string"),
    ({"status": True}, "must be a string"),
    ({"older_than": "later"}, "is not an age"),
])
def test_rest_filter__bad_keys_and_values_are_named(query, message):
    with pytest.raises(ValueError, match=message):
        filter_of(query)
