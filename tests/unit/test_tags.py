"""The pure rules of run tags (queuety.core.tags): what a tag may be, how builder and dispatch
tags merge, and how the ``tag=`` filters parse. No services."""

from __future__ import annotations

import pytest

import queuety
from queuety import exceptions
from queuety.core import tags
from queuety.core.handlers import StepContext


@pytest.mark.parametrize("key", ["customer", "a", "team.billing", "k8s/ns", "x-y_z", "K" * 64])
def test_check_pair__accepts_valid_keys(key):
    assert tags.check_pair(key, "42", "here") == (key, "42")


@pytest.mark.parametrize("key", ["", "has:colon", "has=equals", "sp ace", "é", "K" * 65, 7, None])
def test_check_pair__refuses_a_bad_key_naming_it(key):
    with pytest.raises(exceptions.InvalidPayload) as raised:
        tags.check_pair(key, "v", "the tags of workflow 'w'")
    assert repr(key) in str(raised.value) and "the tags of workflow 'w'" in str(raised.value)
    assert "nothing was written" in str(raised.value)


@pytest.mark.parametrize("value", [42, None, 1.5, ["x"]])
def test_check_pair__refuses_a_value_that_is_not_a_string(value):
    with pytest.raises(exceptions.InvalidPayload, match="'customer'.*type"):
        tags.check_pair("customer", value, "here")


@pytest.mark.parametrize("value", ["x" * 256, "a\x00b", "line\nbreak"])
def test_check_pair__refuses_a_long_or_control_value(value):
    with pytest.raises(exceptions.InvalidPayload, match="'customer'"):
        tags.check_pair("customer", value, "here")


def test_check_pair__accepts_colons_equals_and_unicode_in_values():
    assert tags.check_pair("url", "a:b=c é", "here") == ("url", "a:b=c é")
    assert tags.check_pair("empty", "", "here") == ("empty", "")


def test_check_tags__none_a_mapping_and_limits():
    assert tags.check_tags(None, "here") == {}
    assert tags.check_tags({"a": "1"}, "here") == {"a": "1"}
    with pytest.raises(exceptions.InvalidPayload, match="mapping"):
        tags.check_tags([("a", "1")], "here")
    with pytest.raises(exceptions.InvalidPayload, match="at most 32"):
        tags.check_tags({f"k{n}": "v" for n in range(33)}, "here")


def test_merged__later_layers_win():
    assert tags.merged({"a": "1", "b": "1"}, None, {"b": "2"}, where="x") == {"a": "1", "b": "2"}


def test_parse_filters__rest_and_cli_separators():
    assert tags.parse_filters(["customer:42", "plan:pro"], ":") == {"customer": "42",
                                                                   "plan": "pro"}
    assert tags.parse_filters(["customer=42"], "=") == {"customer": "42"}
    assert tags.parse_filters(["url:a:b"], ":") == {"url": "a:b"}  # the first colon splits
    assert tags.parse_filters([], ":") == {}


@pytest.mark.parametrize("text, problem", [
    ("customer", "not key:value"),
    (":42", "Tag key ''"),
    ("bad key:1", "Tag key 'bad key'"),
])
def test_parse_filters__refuses_bad_filters(text, problem):
    with pytest.raises(ValueError, match=problem):
        tags.parse_filters([text], ":")


def test_parse_filters__one_key_two_values_matches_nothing_and_says_so():
    with pytest.raises(ValueError, match="two values"):
        tags.parse_filters(["a:1", "a:2"], ":")


def test_with_tags__merges_and_leaves_the_definition_hash_alone():
    base = queuety.workflow("tagged_unit").then("tests.tag_steps.plain")
    tagged = base.with_tags({"team": "billing"}).with_tags(region="eu", team="ops")
    assert dict(tagged.build().tags) == {"team": "ops", "region": "eu"}
    assert tagged.build().definition_hash == base.build().definition_hash
    assert "tags" not in tagged.build().to_dict()
    assert tagged.build() == base.build()
    assert tags.of_spec(tagged.build(), {"team": "dispatch"}) == {"team": "dispatch",
                                                                  "region": "eu"}
    with pytest.raises(exceptions.InvalidPayload, match="'bad:key'"):
        base.with_tags({"bad:key": "1"})


def _context(taggable: bool) -> StepContext:
    return StepContext(1, "w", "s", 1, None, tags={} if taggable else None)  # type: ignore[arg-type]


def test_context_tag__collects_checked_tags():
    context = _context(True)
    context.tag("plan", "pro")
    context.tag("plan", "team")
    assert context.tags == {"plan": "team"}
    with pytest.raises(exceptions.InvalidPayload, match="'a=b'"):
        context.tag("a=b", "x")
    with pytest.raises(exceptions.InvalidPayload, match="only task steps"):
        _context(False).tag("plan", "pro")


def test_check_tags__uncapped_for_a_run_s_stored_tags():
    many = {f"k{n}": "v" for n in range(40)}
    assert tags.check_tags(many, "here", most=None) == many
    with pytest.raises(exceptions.InvalidPayload, match="'bad:key'"):
        tags.check_tags({"bad:key": "1"}, "here", most=None)


def test_parse_filters__an_empty_filter_is_no_filter():
    assert tags.parse_filters([""], ":") == {}
    assert tags.parse_filters(["", "plan:pro"], ":") == {"plan": "pro"}


@pytest.mark.parametrize("given", [[], 0, "", ()])
def test_tagged__refuses_falsy_tags_that_are_not_a_mapping(given):
    spec = queuety.workflow("tagged_falsy").then("tests.tag_steps.plain").build()
    with pytest.raises(exceptions.InvalidPayload, match="must be a mapping"):
        tags.tagged(spec, given)
    assert tags.tagged(spec, None) is spec


def test_keys_are_case_sensitive():
    assert tags.merged({"Customer": "1"}, {"customer": "2"}, where="x") == {
        "Customer": "1", "customer": "2"}


@pytest.mark.parametrize("method", ["run_workflow", "start_workflows"])
def test_child_builder_with_tags__refused_at_build_time(method):
    child = queuety.workflow("tagged_child").with_tags(team="ops").then("tests.tag_steps.plain")
    parent = queuety.workflow("tagged_parent").then("tests.tag_steps.plain")
    with pytest.raises(exceptions.WorkflowDefinitionError,
                       match=rf"{method}\(\).*'tagged_child'.*team=ops.*context\.tag\(\)"):
        if method == "run_workflow":
            parent.run_workflow("child", child)
        else:
            parent.start_workflows("items", child)
    untagged = queuety.workflow("tagged_child").then("tests.tag_steps.plain")
    assert parent.run_workflow("child", untagged).build().steps[-1].kind == "child"
