"""The pure half of the deploy check (queuety/core/handler_refs.py): every path a definition
names, and what the code at hand makes of each. No database: the stored JSON is the
builder's, the importer the core's, the aliases a dict."""

from __future__ import annotations

import copy
import json
import sys

import pytest

import queuety
from queuety.core import definition, handler_refs, imports
from queuety.core.handler_refs import HandlerRef, Need

M = "tests.deploy_steps"


def no_alias(path: str) -> str:
    return path


def aliased(table: dict[str, str]):
    return lambda path: table.get(path, path)


def everything() -> queuety.WorkflowBuilder:
    """A workflow naming a path in every place a definition can hold one."""
    child = (queuety.workflow("child").then(f"{M}.Charge")
             .compensate_with(f"{M}.plain").retry(retry_on=[f"{M}.Flaky"]))
    return (queuety.workflow("everything")
            .retry(retry_on=["builtins.ConnectionError"])
            .then(f"{M}.plain", retry=queuety.RetryPolicy(retry_on=[f"{M}.Flaky"]))
            .compensate_with(f"{M}.Charge")
            .route(f"{M}.with_context", {"a": "fan", queuety.DEFAULT: "fan"}, name="pick")
            .parallel([f"{M}.plain", (f"{M}.Charge", {
                "retry": queuety.RetryPolicy(retry_on=["builtins.KeyError"])})], name="fan")
            .for_each("items", f"{M}.needs_three", reducer=f"{M}.reduce_items", name="each")
            .repeat_until("pick", condition=f"{M}.is_done", name="again")
            .run_workflow("kid", child)
            .start_workflows("kids", child, name="spawn")
            .on_cancel(f"{M}.plain").on_deadline(f"{M}.Charge"))


def test_enumeration__names_every_path_with_what_its_call_site_needs():
    data = everything().build().to_dict()
    refs = handler_refs.handler_refs(everything().build()) + handler_refs.retry_refs(data)
    assert {(r.where, r.path, r.need) for r in refs} == {
        ("The workflow's retry policy", "builtins.ConnectionError", Need.EXCEPTION),
        ("The retry policy of step 'plain'", f"{M}.Flaky", Need.EXCEPTION),
        ("The retry policy of branch 1 of parallel step 'fan'", "builtins.KeyError",
         Need.EXCEPTION),
        ("Step 'plain'", f"{M}.plain", Need.STEP),
        ("The compensation of step 'plain'", f"{M}.Charge", Need.CLEANUP),
        ("Route step 'pick'", f"{M}.with_context", Need.STEP),
        ("Branch 0 of parallel step 'fan'", f"{M}.plain", Need.BRANCH),
        ("Branch 1 of parallel step 'fan'", f"{M}.Charge", Need.BRANCH),
        ("For-each step 'each'", f"{M}.needs_three", Need.ITEM),
        ("The reducer of for-each step 'each'", f"{M}.reduce_items", Need.REDUCER),
        ("The condition of repeat step 'again'", f"{M}.is_done", Need.CONDITION),
        ("The on_cancel hook", f"{M}.plain", Need.CLEANUP),
        ("The on_deadline hook", f"{M}.Charge", Need.CLEANUP),
    }


def test_check_definition__a_definition_that_still_fits_has_no_failure():
    data = everything().build().to_dict()
    found = handler_refs.check_definition(data, imports.import_exact, no_alias)
    assert found.failures == [] and found.aliased == []
    # The children of run_workflow() and start_workflows() are checked too.
    assert {f.ref.where for f in found.findings} >= {
        "Step 'Charge' of child workflow 'kid' (step 'kid')",
        "The compensation of step 'Charge' of child workflow 'child' (step 'spawn')",
        "The workflow's retry policy of child workflow 'kid' (step 'kid')"}


def renamed(data: dict, old: str, new: str) -> dict:
    """``data`` with every occurrence of the path ``old`` replaced by ``new``, as a deploy that
    renamed the handler leaves a stored definition."""
    canonical = definition.canonical_json(data)
    text = canonical.replace(f'"{old}"', f'"{new}"')
    assert text != canonical, f"{old!r} is not in the definition"
    return json.loads(text)


@pytest.mark.parametrize("old, where", [
    (f"{M}.plain", "Step 'plain'"),
    (f"{M}.with_context", "Route step 'pick'"),
    (f"{M}.needs_three", "For-each step 'each'"),
    (f"{M}.reduce_items", "The reducer of for-each step 'each'"),
    (f"{M}.is_done", "The condition of repeat step 'again'"),
])
def test_check_definition__a_renamed_handler_fails_naming_its_step_and_path(old, where):
    data = renamed(everything().build().to_dict(), old, f"{M}.gone")
    found = handler_refs.check_definition(data, imports.import_exact, no_alias)
    assert f"{where} names '{M}.gone', which does not import in this code (ImportError: " \
           f"'{M}.gone' is not an importable dotted path)." in found.failures


def test_check_definition__a_missing_module_and_a_broken_child_are_reported():
    data = renamed(everything().build().to_dict(), f"{M}.Charge", "tests.no_such_module.Charge")
    found = handler_refs.check_definition(data, imports.import_exact, no_alias)
    wheres = {f.ref.where for f in found.findings if not f.ok}
    assert wheres == {"The compensation of step 'plain'", "Branch 1 of parallel step 'fan'",
                      "The on_deadline hook", "Step 'Charge' of child workflow 'kid' (step 'kid')",
                      "Step 'Charge' of child workflow 'child' (step 'spawn')"}
    assert all(f.ok for f in found.findings if f.ref.path != "tests.no_such_module.Charge")


def test_check_definition__an_alias_makes_the_renamed_path_fine_and_is_reported():
    data = renamed(everything().build().to_dict(), f"{M}.needs_three", f"{M}.old_items")
    found = handler_refs.check_definition(data, imports.import_exact,
                                          aliased({f"{M}.old_items": f"{M}.needs_three"}))
    assert found.failures == []
    [via] = found.aliased
    assert (via.ref.path, via.target, via.ref.where) == (
        f"{M}.old_items", f"{M}.needs_three", "For-each step 'each'")
    assert via.to_dict()["alias"] == f"{M}.needs_three"


def test_check_definition__an_alias_to_a_wrong_kind_or_to_nothing_fails():
    data = renamed(everything().build().to_dict(), f"{M}.needs_three", f"{M}.old_items")
    wrong = handler_refs.check_definition(data, imports.import_exact,
                                          aliased({f"{M}.old_items": f"{M}.Charge"}))
    assert wrong.failures == [
        f"For-each step 'each' names '{M}.old_items', aliased to '{M}.Charge', which is the "
        "class 'Charge', which has no handle_item() method; give it one, or name a function "
        "handler(state, item, index)."]
    nowhere = handler_refs.check_definition(data, imports.import_exact,
                                            aliased({f"{M}.old_items": f"{M}.gone"}))
    assert nowhere.failures == [
        f"For-each step 'each' names '{M}.old_items', aliased to '{M}.gone', which does not "
        f"import in this code (ImportError: '{M}.gone' is not an importable dotted path)."]


def test_check_definition__a_definition_that_no_longer_loads_is_a_failure():
    data = everything().build().to_dict()
    routed = copy.deepcopy(data)
    routed["steps"][1]["routes"] = {"a": "fanned"}  # a route target renamed away
    [problem] = handler_refs.check_definition(routed, imports.import_exact, no_alias).failures
    assert problem.startswith("The stored definition 'everything' no longer loads "
                              "(WorkflowDefinitionError: Route step 'pick' of workflow "
                              "'everything' targets 'fanned', which name no step")
    assert problem.endswith("so its runs fail at their next step.")
    # A retry_on class that is gone: its own finding, and the definition no longer loads.
    gone = renamed(data, f"{M}.Flaky", f"{M}.Vanished")
    failures = handler_refs.check_definition(gone, imports.import_exact, no_alias).failures
    assert any(f.startswith("The stored definition 'everything' no longer loads") for f in
               failures)
    assert f"The retry policy of step 'plain' names '{M}.Vanished', which does not import in " \
           f"this code (ImportError: '{M}.Vanished' is not an importable dotted path)." \
           in failures


@pytest.mark.parametrize("name, need, problem", [
    ("Charge", Need.STEP, None),
    ("plain", Need.STEP, None),
    ("with_context", Need.STEP, None),
    ("awaits", Need.STEP, None),           # async fits a prefork worker and the I/O lane
    ("streams", Need.STEP, None),          # a then() step may stream
    ("Streams", Need.STEP, None),
    ("NotAStep", Need.STEP, "is the class 'NotAStep', which has no handle() method"),
    ("Unimplemented", Need.STEP, "is the class 'Unimplemented', which has no handle() method"),
    ("needs_three", Need.STEP, "is a function that cannot be called as handler(state)"),
    ("takes_nothing", Need.STEP, "is a function that cannot be called as handler(state)"),
    ("NOT_CALLABLE", Need.STEP, "is a int, not a function handler(state) or a class"),
    ("streams", Need.BRANCH, "is a generator (a streaming handler), which a parallel branch "
                             "cannot be: only a then() step streams"),
    ("Streams", Need.CLEANUP, "which a compensation or hook cannot be"),
    ("Items", Need.ITEM, None),
    ("needs_three", Need.ITEM, None),
    ("plain", Need.ITEM, "is a function that cannot be called as handler(state, item, index)"),
    ("Charge", Need.ITEM, "is the class 'Charge', which has no handle_item() method"),
    ("reduce_items", Need.REDUCER, None),
    ("Reducer", Need.REDUCER, None),
    ("reduce_later", Need.REDUCER, "is an async function, but reducer(state, aggregate) is "
                                   "called without being awaited"),
    ("is_done", Need.CONDITION, None),
    ("is_done_later", Need.CONDITION, "is an async function"),
    ("Charge", Need.CONDITION, "is the class 'Charge', not a function condition(state)"),
    ("Flaky", Need.EXCEPTION, None),
    ("plain", Need.EXCEPTION, "is a function, not an exception class"),
])
def test_kind__each_call_site_gets_what_it_can_call(name, need, problem):
    found = handler_refs.check_ref(HandlerRef(f"{M}.{name}", need, "Step 's'"),
                                   imports.import_exact, no_alias)
    if problem is None:
        assert found.ok, found.problem
    else:
        assert problem in found.problem
        assert found.problem.startswith(f"Step 's' names '{M}.{name}', which ")


def test_check_ref__an_alias_declared_by_importing_the_old_module_is_followed(tmp_path,
                                                                            monkeypatch):
    # queuety.alias() beside the renamed handler: importing the old path's module declares it.
    (tmp_path / "deploy_moved.py").write_text(
        "import queuety\n\ndef charge_card(state):\n    return {}\n\n"
        "queuety.alias('deploy_moved.charge', 'deploy_moved.charge_card')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        found = handler_refs.check_ref(HandlerRef("deploy_moved.charge", Need.STEP, "Step 'c'"),
                                       imports.import_exact, imports.resolve)
        assert (found.ok, found.target) == (True, "deploy_moved.charge_card")
    finally:
        imports.remove_alias("deploy_moved.charge")
        sys.modules.pop("deploy_moved", None)


def test_check_ref__a_module_that_raises_on_import_is_a_failure(tmp_path, monkeypatch):
    (tmp_path / "deploy_raises.py").write_text("raise RuntimeError('no config here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = handler_refs.check_ref(HandlerRef("deploy_raises.step", Need.STEP, "Step 'r'"),
                                   imports.import_exact, no_alias)
    assert found.problem == ("Step 'r' names 'deploy_raises.step', which does not import in "
                             "this code (RuntimeError: no config here).")
    sys.modules.pop("deploy_raises", None)
