"""Handler aliases (queuety/core/imports.py): ``queuety.alias()``, ``QUEUETY["HANDLER_ALIASES"]``,
how ``import_path`` follows them, and how the settings are checked."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

import queuety
from queuety import checks, conf
from queuety.core import imports
from queuety.core.describe import describe_step
from tests import deploy_steps
from tests.settings import QUEUETY as TEST_QUEUETY

M = "tests.deploy_steps"


@pytest.fixture
def declared():
    """Aliases declared by the test, taken back after it."""
    made: list[str] = []

    def declare(old: str, new: str) -> None:
        queuety.alias(old, new)
        made.append(old)

    yield declare
    for old in made:
        imports.remove_alias(old)


def aliases_setting(table):
    return override_settings(QUEUETY={**TEST_QUEUETY, "HANDLER_ALIASES": table})


def test_alias__import_path_follows_it_and_the_cache_does_not_hide_it(declared):
    with pytest.raises(ImportError, match=f"'{M}.charge' is not an importable dotted path"):
        imports.import_path(f"{M}.charge")
    assert imports.import_path(f"{M}.plain") is deploy_steps.plain  # now cached
    declared(f"{M}.charge", f"{M}.Charge")
    declared(f"{M}.plain", f"{M}.with_context")  # an alias wins over a path that imports
    assert imports.import_path(f"{M}.charge") is deploy_steps.Charge
    assert imports.import_path(f"{M}.plain") is deploy_steps.with_context
    imports.remove_alias(f"{M}.plain")
    assert imports.import_path(f"{M}.plain") is deploy_steps.plain


def test_alias__a_chain_is_followed_to_its_end(declared):
    declared(f"{M}.first", f"{M}.second")
    declared(f"{M}.second", f"{M}.Charge")
    assert imports.resolve(f"{M}.first") == f"{M}.Charge"
    assert imports.import_path(f"{M}.first") is deploy_steps.Charge


@pytest.mark.parametrize("old, new, problem", [
    ("charge", f"{M}.Charge", "'charge' is not a dotted import path"),
    (f"{M}.x", "", "'' is not a dotted import path"),
    (f"{M}.x", f"{M}. Charge", f"'{M}. Charge' is not a dotted import path"),
    (f"{M}.x", f"{M}.x", f"'{M}.x' is aliased to itself."),
])
def test_alias__a_bad_path_or_an_alias_to_itself_is_refused(old, new, problem):
    with pytest.raises(ValueError) as raised:
        queuety.alias(old, new)
    assert str(raised.value).startswith(f"queuety.alias({old!r}, {new!r}) is refused: ")
    assert problem in str(raised.value)
    assert old not in imports.aliases()


def test_alias__one_that_closes_a_loop_is_refused(declared):
    declared(f"{M}.a", f"{M}.b")
    declared(f"{M}.b", f"{M}.c")
    with pytest.raises(ValueError, match=r"the aliases loop: 'tests.deploy_steps.c' -> "
                                         r"'tests.deploy_steps.a' -> 'tests.deploy_steps.b' "
                                         r"-> 'tests.deploy_steps.c'\."):
        queuety.alias(f"{M}.c", f"{M}.a")
    assert imports.resolve(f"{M}.a") == f"{M}.c"


def test_settings__aliases_apply_and_are_read_again_when_the_setting_changes(declared):
    declared(f"{M}.old", f"{M}.plain")
    with aliases_setting({f"{M}.old": f"{M}.Charge", f"{M}.older": f"{M}.old"}):
        # The settings win over queuety.alias() for a path in both; a chain crosses tables.
        assert imports.import_path(f"{M}.old") is deploy_steps.Charge
        assert imports.import_path(f"{M}.older") is deploy_steps.Charge
        assert imports.aliases() == {f"{M}.old": f"{M}.Charge", f"{M}.older": f"{M}.old"}
    assert imports.import_path(f"{M}.old") is deploy_steps.plain
    assert f"{M}.older" not in imports.aliases()


@pytest.mark.parametrize("table, problem", [
    (["a.b"], "aliases are a dict of old dotted paths to new ones"),
    ({"a.b": 3}, "3 is not a dotted import path"),
    ({"  ": "a.b"}, "'  ' is not a dotted import path"),
    ({"a.b": "a.b"}, "'a.b' is aliased to itself."),
    ({"a.b": "c.d", "c.d": "a.b"}, "the aliases loop: 'a.b' -> 'c.d' -> 'a.b'."),
])
def test_settings__a_bad_alias_table_is_refused_naming_the_key(table, problem):
    with aliases_setting(table):
        with pytest.raises(ImproperlyConfigured) as raised:
            conf.settings.validate()
        found = checks.check_queuety_settings()
    assert str(raised.value).startswith("QUEUETY['HANDLER_ALIASES'] must map old dotted "
                                        "handler paths to new ones: ")
    assert problem in str(raised.value)
    assert [m.id for m in found] == ["queuety.E003"] and problem in found[0].msg


def test_settings__a_chain_without_a_loop_is_accepted():
    with aliases_setting({"a.b": "c.d", "c.d": "e.f"}):
        conf.settings.validate()
        assert imports.resolve("a.b") == "e.f"


def test_shown__an_aliased_path_reads_old_then_new(declared):
    declared(f"{M}.old_items", f"{M}.needs_three")
    spec = (queuety.workflow("shown").then(f"{M}.plain")
            .for_each("items", f"{M}.needs_three").build())
    items = spec.steps[1]
    stored = type(items)(name=items.name, handler=f"{M}.old_items", fanout=items.fanout)
    assert describe_step(stored, imports.shown).startswith(
        f"{M}.old_items → {M}.needs_three for each item")
    assert describe_step(spec.steps[0], imports.shown) == f"{M}.plain"
    assert describe_step(stored).startswith(f"{M}.old_items for each item")
