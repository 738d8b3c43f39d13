"""Declaring model triggers (queuety.trigger): what is accepted, and each refusal's message.
Pure logic: no database (nothing here saves a row)."""

from __future__ import annotations

import pytest
from django.db import models

import queuety
from queuety.triggers import declare, fire
from tests import workflows as steps
from tests.testapp.models import Article

BUILDER = queuety.workflow("unit_trigger").then(steps.step_a)


@pytest.fixture
def named():
    """Trigger names a test declares are forgotten after it."""
    names: list[str] = []
    yield names
    for name in names:
        declare.forget(name)


def declare_as(named, name, model=Article, **options):
    named.append(name)
    return queuety.trigger(model, name=name, **options)


def test_a_model_string_or_class__with_a_registered_name_or_a_builder(named):
    by_label = declare_as(named, "u1", "queuety_testapp.Article", on="created",
                          start="reg_letters")
    by_class = declare_as(named, "u2", on="saved", start=BUILDER)

    assert (by_label.model, by_label.action, by_label.start, by_label.spec) == \
        (Article, declare.START, "reg_letters", None)
    assert by_class.spec is not None and by_class.spec.name == "unit_trigger" \
        and by_class.start is None
    assert by_class.label == "queuety_testapp.Article"


def test_the_default_name_is_the_event_and_the_target():
    declared = queuety.trigger(Article, on="deleted", start="reg_letters")
    try:
        assert declared.name == "deleted:reg_letters"
        assert declared in declare.for_event(Article, "deleted")
    finally:
        declare.forget(declared.name)


def test_saved__fires_for_created_and_updated_not_deleted(named):
    declared = declare_as(named, "u-saved", on="saved", start="reg_letters")

    assert [declared.listens_to(event) for event in ("created", "updated", "deleted")] == \
        [True, True, False]
    assert declared in declare.for_event(Article, "updated")
    assert declared not in declare.for_event(Article, "deleted")


def test_declaring_the_same_name_again_replaces_it(named):
    declare_as(named, "u-again", on="created", start="reg_letters")
    declare_as(named, "u-again", on="created", start="reg_small")

    [found] = [each for each in declare.declared() if each.name == "u-again"]
    assert found.start == "reg_small"


def test_signal_with_run_and_signal_or_start(named):
    to_run = declare_as(named, "u-sig", on="updated", signal="go", run=lambda a: a.run_id)
    or_start = declare_as(named, "u-sos", on="updated", signal="go", start="reg_letters")

    assert (to_run.action, to_run.signal) == (declare.SIGNAL_RUN, "go")
    assert (or_start.action, or_start.start) == (declare.SIGNAL_OR_START, "reg_letters")


def test_flow_options__only_those_given_are_kept_and_singletons_signal_joins_them(named):
    debounced = declare_as(named, "u-deb", on="saved", start="reg_letters", debounce=5,
                           singleton=False, batch=None)
    single = declare_as(named, "u-single", on="saved", start="reg_letters", singleton=True,
                        on_conflict="signal", signal="more")
    plain = declare_as(named, "u-plain", on="saved", start="reg_letters")

    assert debounced.flow == {"debounce": 5}
    assert single.flow == {"singleton": True, "on_conflict": "signal", "signal": "more"}
    assert single.action == declare.START
    assert plain.flow == {}


@pytest.mark.parametrize(("options", "says"), [
    ({"model": "queuety_testapp.Nothing"}, "no installed model is"),
    ({"model": "not a label"}, "no installed model is"),
    ({"model": 42}, "must be a Django model class"),
    ({"on": "changed"}, "on= must be one of"),
    ({"start": None}, "needs start="),
    ({"start": "   "}, "not blank"),
    ({"start": 7}, "start= must be a registered workflow's name"),
    ({"start": None, "run": lambda a: 1}, "run= names the run a signal is sent to"),
    ({"signal": "go", "run": lambda a: 1}, "without start="),
    ({"start": None, "signal": "go", "run": lambda a: 1, "debounce": 3}, "without start="),
    ({"signal": "", "start": "reg_letters"}, "signal= must be a signal's name"),
    ({"signal": "go", "debounce": 2}, "takes no flow options"),
    ({"payload": "state"}, "payload= must be a function"),
    ({"when": True}, "when= must be a function"),
    ({"key": "k"}, "key= must be a function"),
    ({"debounce": 0}, "positive number"),
    ({"debounce": True}, "positive number"),
    ({"debounce": 2, "singleton": True}, "give one of them"),
    ({"batch": object(), "debounce": 1}, "give one of them"),
    ({"singleton": "yes"}, "singleton= is True or False"),
    ({"on_conflict": "queue"}, "comes with singleton=True"),
    ({"singleton": True, "on_conflict": "merge"}, "on_conflict= must be one of"),
    ({"singleton": True, "on_conflict": "queue", "signal": "x"}, "pass on_conflict='signal'"),
    ({"singleton": True, "signal": "x"}, "pass on_conflict='signal'"),
    ({"throttle": 3}, "unknown option(s) throttle"),
    ({"name": " "}, "name= must be a non-blank string"),
])
def test_refused__with_a_message_naming_the_option(options, says):
    arguments = {"model": Article, "on": "created", "start": "reg_letters", **options}
    model = arguments.pop("model")

    with pytest.raises(queuety.WorkflowDefinitionError) as refused:
        queuety.trigger(model, **arguments)

    assert says in str(refused.value)
    assert str(refused.value).startswith("queuety.trigger(")
    assert not [each for each in declare.declared() if each.model is Article
                and each.name not in ("autodiscovered",)]


def test_refused__an_abstract_model():
    class Base(models.Model):
        class Meta:
            abstract = True
            app_label = "queuety_testapp"

    with pytest.raises(queuety.WorkflowDefinitionError, match="abstract"):
        queuety.trigger(Base, on="created", start="reg_letters")


def test_a_bad_builder_fails_at_declaration():
    with pytest.raises(queuety.WorkflowDefinitionError):
        queuety.trigger(Article, on="created", start=queuety.workflow("empty"))


def test_fire__refuses_an_unknown_event_or_an_unsaved_instance():
    with pytest.raises(ValueError, match="event must be one of"):
        queuety.fire(Article(pk=1), "saved")
    with pytest.raises(ValueError, match="needs a saved model instance"):
        queuety.fire(Article(), "created")


def test_key__a_key_function_is_kept_apart_per_workflow_and_a_long_one_is_hashed(named):
    short = declare_as(named, "u-key", on="created", start="reg_letters",
                       key=lambda a: f"article:{a.pk}")
    long = declare_as(named, "u-long", on="created", start="reg_letters",
                      key=lambda a: "x" * 300)
    blank = declare_as(named, "u-blank", on="created", start="reg_letters",
                       key=lambda a: " ")

    assert fire.trigger_key(short, Article(pk=7)) == "trigger:reg_letters:article:7"
    hashed = fire.trigger_key(long, Article(pk=7))
    assert hashed.startswith("trigger:sha256:") and len(hashed) <= 255
    with pytest.raises(queuety.InvalidPayload, match="non-blank string"):
        fire.trigger_key(blank, Article(pk=7))


def test_key__flow_and_signal_or_start_default_to_the_row_alone(named):
    debounced = declare_as(named, "u-flowkey", on="saved", start="reg_letters", debounce=2)
    or_start = declare_as(named, "u-soskey", on="saved", start="reg_letters", signal="go")

    assert fire.trigger_key(debounced, Article(pk=9)) == \
        "trigger:queuety_testapp.Article:9:u-flowkey"
    assert fire.trigger_key(or_start, Article(pk=9)) == \
        "trigger:queuety_testapp.Article:9:u-soskey"
