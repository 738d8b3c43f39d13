"""The state edit's JSON merge patch (RFC 7396) and diff: pure logic."""

from __future__ import annotations

import pytest

from queuety.core import state_patch
from queuety.exceptions import InvalidStateEdit


def test_a_merge_patch_sets_merges_replaces_and_deletes():
    state = {"order": {"id": 7, "lines": [1, 2], "note": "x"}, "total": 10, "gone": True}
    patch = {"order": {"lines": [3], "note": None, "rush": True}, "total": 12, "gone": None}
    assert state_patch.apply_patch(state, patch) == {
        "order": {"id": 7, "lines": [3], "rush": True}, "total": 12}
    assert state == {"order": {"id": 7, "lines": [1, 2], "note": "x"}, "total": 10,
                     "gone": True}  # unchanged


def test_an_object_patch_replaces_a_value_that_is_not_an_object():
    assert state_patch.apply_patch({"a": 1}, {"a": {"b": 2}}) == {"a": {"b": 2}}


def test_the_diff_lists_each_changed_leaf_with_a_json_pointer():
    before = {"order": {"id": 7, "note": "x"}, "total": 10, "a/b~": 1}
    after = {"order": {"id": 8}, "total": 10, "new": [1], "a/b~": 1}
    assert state_patch.diff(before, after) == [
        {"path": "/new", "after": [1]},
        {"path": "/order/id", "before": 7, "after": 8},
        {"path": "/order/note", "before": "x"},
    ]
    assert state_patch.diff({"a/b~": 1}, {"a/b~": 2}) == [
        {"path": "/a~1b~0", "before": 1, "after": 2}]


def test_the_diff_tells_json_types_apart():
    assert state_patch.diff({"a": 1}, {"a": True}) == [{"path": "/a", "before": 1,
                                                         "after": True}]
    assert state_patch.diff({"a": 1}, {"a": 1.0}) != []


def test_make_patch_is_the_inverse_of_apply():
    before = {"order": {"id": 7, "note": "x"}, "total": 10, "keep": [1]}
    after = {"order": {"id": 8}, "total": 10, "keep": [1], "new": {"x": 1}}
    patch = state_patch.make_patch(before, after)
    assert patch == {"order": {"id": 8, "note": None}, "new": {"x": 1}}
    assert state_patch.apply_patch(before, patch) == after
    assert state_patch.make_patch(before, before) == {}


def test_make_patch_refuses_a_null_it_cannot_express():
    with pytest.raises(InvalidStateEdit, match="cannot store null"):
        state_patch.make_patch({"a": 1}, {"a": None})


@pytest.mark.parametrize(("patch", "words"), [
    ([1], "must be a JSON object"),
    ({"_private": 1}, "reserved"),
    ({"a": float("nan")}, "JSON cannot hold"),
    ({"a": {"b": (1, 2)}}, r"at /a/b is a tuple"),
    ({"a": {1: 2}}, "not a string"),
])
def test_check_patch_refuses_what_a_state_cannot_hold(patch, words):
    with pytest.raises(InvalidStateEdit, match=words):
        state_patch.check_patch(patch)


def test_check_patch_takes_plain_json():
    patch = {"a": {"b": [1, 2.5, "x", True, None]}, "c": None}
    assert state_patch.check_patch(patch) is patch


def test_check_patch_refuses_a_patch_nested_too_deeply():
    deep: dict = {}
    inner = deep
    for _ in range(5000):
        inner["a"] = {}
        inner = inner["a"]
    with pytest.raises(InvalidStateEdit, match="nested too deeply"):
        state_patch.check_patch(deep)


def test_make_patch_refuses_a_null_nested_in_an_object_that_replaces_a_value():
    # {"a": {"b": null}} over a non-object would merge as {"a": {}}: the null is lost.
    for before in ({"a": 1}, {}):
        with pytest.raises(InvalidStateEdit, match="The key 'b' is set to null"):
            state_patch.make_patch(before, {"a": {"b": None, "c": 1}})
    patch = state_patch.make_patch({"a": 1}, {"a": {"c": {"d": 2}}})
    assert state_patch.apply_patch({"a": 1}, patch) == {"a": {"c": {"d": 2}}}
