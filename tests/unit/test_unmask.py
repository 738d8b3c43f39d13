"""The admin's state editor shows secrets masked: ``queuety.masking.unmask`` puts the real
values back where the edited text still holds the mask, in objects and lists."""

from __future__ import annotations

import pytest

from queuety.core.state_patch import make_patch
from queuety.exceptions import InvalidStateEdit
from queuety.masking import MASK, unmask

REAL = {"cards": [{"number": "4111", "label": "x"}, {"number": "5500", "label": "y"}],
        "owner": {"pin": "1234", "name": "ann"}}
SHOWN = {"cards": [{"number": MASK, "label": "x"}, {"number": MASK, "label": "y"}],
         "owner": {"pin": MASK, "name": "ann"}}


def test_a_mask_left_in_a_list_keeps_the_real_value():
    edited = {"cards": [{"number": MASK, "label": "x2"}, {"number": MASK, "label": "y"}],
              "owner": {"pin": MASK, "name": "bob"}}
    restored = unmask(SHOWN, edited, REAL)
    assert restored["cards"][0] == {"number": "4111", "label": "x2"}
    assert restored["cards"][1]["number"] == "5500" and restored["owner"]["pin"] == "1234"
    assert make_patch(REAL, restored) == {
        "cards": [{"number": "4111", "label": "x2"}, {"number": "5500", "label": "y"}],
        "owner": {"name": "bob"}}


def test_a_typed_value_replaces_the_secret_and_the_mask_where_none_was_stays_text():
    edited = {"cards": [{"number": "4222", "label": MASK}, SHOWN["cards"][1]],
              "owner": SHOWN["owner"]}
    restored = unmask(SHOWN, edited, REAL)
    assert restored["cards"][0] == {"number": "4222", "label": MASK}


def test_a_list_holding_masks_that_changes_length_is_refused():
    edited = {"cards": [SHOWN["cards"][1]], "owner": SHOWN["owner"]}
    with pytest.raises(InvalidStateEdit, match="The list at /cards holds masked secret values"
                                               " and now has 1 items instead of 2"):
        unmask(SHOWN, edited, REAL)
    # A list with no masked value may change freely.
    assert unmask({"tags": ["a"]}, {"tags": ["a", "b"]}, {"tags": ["a"]}) == {"tags": ["a", "b"]}
