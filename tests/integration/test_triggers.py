"""Model triggers (queuety.trigger, queuety.fire) on PostgreSQL with a real worker: the run is
written in the save's transaction, commits or rolls back with it, and completes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.db import connection, transaction

import queuety
from queuety.models import DispatchKey, Event, Signal, WorkflowRun
from queuety.triggers import declare
from queuety.triggers.fire import TriggerFailed
from tests import keyed_steps, trigger_steps, workflows
from tests.integration.conftest import wait_for
from tests.testapp.models import Article

pytestmark = pytest.mark.worker

LABEL = "queuety_testapp.Article"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def declared():
    """Triggers a test declares (their names) are forgotten after it."""
    names: list[str] = []
    yield names
    for name in names:
        declare.forget(name)


def look_up_workflow(name: str):
    return queuety.workflow(name).then(trigger_steps.look_up)


def declare_for(declared, token: str, on: str, **options):
    """A trigger on Article that fires only for this test's rows (``token``)."""
    name = f"{on}-{token}-{uuid.uuid4().hex[:6]}"
    declared.append(name)
    options.setdefault("start", look_up_workflow(f"trig_{on}"))
    when = options.pop("when", None)
    return queuety.trigger(Article, on=on, name=name,
                           when=lambda a: a.token == token and (when is None or when(a)),
                           **options)


def runs_of(trigger) -> list[WorkflowRun]:
    return list(WorkflowRun.objects.filter(
        idempotency_key__startswith=f"trigger:{LABEL}:").filter(
        idempotency_key__contains=f":{trigger.name}:").order_by("pk"))


def from_another_connection(query):
    """Run ``query()`` on a connection of its own (a new thread's) and return its result."""
    result: list = []

    def target():
        try:
            result.append(query())
        finally:
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    return result[0]


@pytest.mark.parametrize("on", ["created", "updated", "deleted"])
def test_each_event__starts_a_run_that_completes_with_the_default_payload(worker, token,
                                                                           declared, on):
    trigger = declare_for(declared, token, on)
    article = Article.objects.create(token=token, title="first")

    with transaction.atomic():
        if on == "updated":
            article.title = "second"
            article.save()
        elif on == "deleted":
            pk = article.pk
            article.delete()
            article.pk = pk

    [run] = runs_of(trigger)
    status = wait_for(run.pk, worker=worker)
    assert status.status == "completed"
    assert {key: status.state[key] for key in ("model", "pk", "event")} == \
        {"model": LABEL, "pk": article.pk, "event": on}
    assert status.state["row_exists"] is (on != "deleted")
    if on == "updated":
        assert status.state["title"] == "second"


def test_saved__a_create_and_a_later_update_start_one_run_each(worker, token, declared):
    trigger = declare_for(declared, token, "saved")

    article = Article.objects.create(token=token)
    article.title = "edited"
    article.save()

    runs = runs_of(trigger)
    assert [run.state["event"] for run in runs] == ["created", "updated"]
    assert [wait_for(run.pk, worker=worker).status for run in runs] == ["completed"] * 2


def test_queryset_delete__sends_post_delete_for_each_row_so_deleted_fires(worker, token,
                                                                          declared):
    trigger = declare_for(declared, token, "deleted")
    Article.objects.bulk_create([Article(token=token) for _ in range(3)])

    Article.objects.filter(token=token).delete()

    assert len(runs_of(trigger)) == 3


def test_rollback__a_save_that_rolls_back_starts_no_run(worker, token, declared):
    trigger = declare_for(declared, token, "created")

    with pytest.raises(RuntimeError), transaction.atomic():
        article = Article.objects.create(token=token)
        assert len(runs_of(trigger)) == 1  # written in the save's transaction...
        raise RuntimeError("the view failed after the save")

    assert runs_of(trigger) == []  # ... and rolled back with it
    assert not Article.objects.filter(pk=article.pk).exists()
    assert not DispatchKey.objects.filter(key__contains=f":{trigger.name}:").exists()


def test_commit__the_run_is_visible_from_another_connection_the_moment_the_save_commits(
        worker, token, declared):
    trigger = declare_for(declared, token, "created")

    def count():
        return WorkflowRun.objects.filter(
            idempotency_key__contains=f":{trigger.name}:").count()

    with transaction.atomic():
        article = Article.objects.create(token=token)
        before_commit = from_another_connection(count)
    right_after_commit = from_another_connection(count)

    assert (before_commit, right_after_commit) == (0, 1)
    [run] = runs_of(trigger)
    assert run.state["pk"] == article.pk
    assert wait_for(run.pk, worker=worker).status == "completed"


def test_same_transaction__saving_twice_and_firing_start_one_run_a_later_one_another(
        worker, token, declared):
    trigger = declare_for(declared, token, "updated")
    article = Article.objects.create(token=token)

    with transaction.atomic():
        article.title = "one"
        article.save()
        article.title = "two"
        article.save()
        fired = queuety.fire(article, "updated")
    assert len(runs_of(trigger)) == 1
    assert [(each.trigger, each.started) for each in fired] == [(trigger.name, False)]
    assert fired[0].run_id == runs_of(trigger)[0].pk

    article.title = "three"
    article.save()  # autocommit: its own transaction, so a second run

    runs = runs_of(trigger)
    assert len(runs) == 2
    assert [wait_for(run.pk, worker=worker).status for run in runs] == ["completed"] * 2


def test_when__filters_the_rows_that_fire(worker, token, declared):
    trigger = declare_for(declared, token, "saved", when=lambda a: a.status == "published",
                          payload=lambda a: {"pk": a.pk, "status": a.status})
    article = Article.objects.create(token=token)
    assert runs_of(trigger) == []

    article.status = "published"
    article.save()

    [run] = runs_of(trigger)
    assert run.state == {"pk": article.pk, "status": "published"}
    assert wait_for(run.pk, worker=worker).status == "completed"


def test_fire__covers_queryset_update_and_bulk_create(worker, token, declared):
    created = declare_for(declared, token, "created")
    updated = declare_for(declared, token, "updated")

    with transaction.atomic():
        rows = Article.objects.bulk_create([Article(token=token) for _ in range(2)])
        assert runs_of(created) == []  # bulk_create sends no post_save
        for row in rows:
            queuety.fire(row, "created")
    with transaction.atomic():
        Article.objects.filter(token=token).update(status="published")
        assert runs_of(updated) == []  # nor does QuerySet.update()
        for row in Article.objects.filter(token=token):
            queuety.fire(row, "updated")

    for trigger, event in ((created, "created"), (updated, "updated")):
        runs = runs_of(trigger)
        assert sorted(run.state["pk"] for run in runs) == sorted(row.pk for row in rows)
        assert {run.state["event"] for run in runs} == {event}
        assert [wait_for(run.pk, worker=worker).status for run in runs] == ["completed"] * 2


def test_signal_with_run__delivers_the_signal_to_the_waiting_run(worker, token, declared):
    waiting = (queuety.workflow("trig_waiting").wait_for_signal("published", "article")
               .then(workflows.step_a).dispatch({"token": token}))
    assert wait_for(waiting, ("waiting_for_signal",), worker=worker).status == \
        "waiting_for_signal"
    trigger = declare_for(declared, token, "updated", start=None, signal="published",
                          run=lambda a: a.run_id, when=lambda a: a.status == "published",
                          payload=lambda a: {"title": a.title})
    article = Article.objects.create(token=token, run_id=waiting)

    with transaction.atomic():
        article.status, article.title = "published", "Hello"
        article.save()
        article.save()  # the same transaction: one signal

    status = wait_for(waiting, worker=worker)
    assert status.status == "completed" and status.state["article"] == {"title": "Hello"}
    [stored] = Signal.objects.filter(run_id=waiting, name="published")
    assert stored.sent_by == f"trigger:{trigger.name}"


def test_error__a_failing_trigger_raises_in_the_save_and_rolls_it_back(token, declared):
    def broken(article):
        raise KeyError("no such field")

    trigger = declare_for(declared, token, "created", payload=broken)

    with pytest.raises(TriggerFailed) as raised, transaction.atomic():
        Article.objects.create(token=token)

    message = str(raised.value)
    assert trigger.name in message and LABEL in message and "KeyError" in message
    assert not Article.objects.filter(token=token).exists()


def test_error__an_unknown_workflow_raises_naming_the_trigger_and_model(token, declared):
    trigger = declare_for(declared, token, "created", start="no_such_workflow")

    with pytest.raises(TriggerFailed, match="no_such_workflow") as raised, \
            transaction.atomic():
        Article.objects.create(token=token)

    assert trigger.name in str(raised.value) and LABEL in str(raised.value)
    assert not Article.objects.filter(token=token).exists()


def test_autodiscovered__a_trigger_in_an_apps_workflows_py_is_declared_and_fires(worker,
                                                                                  token):
    assert "autodiscovered" in [each.name for each in declare.declared()]

    Article.objects.create(token=token, status="autodiscover")

    [run] = WorkflowRun.objects.filter(idempotency_key__contains=":autodiscovered:",
                                       state__token=token)
    assert run.name == "reg_letters"
    assert wait_for(run.pk, worker=worker).status == "completed"


def test_signal_with_run__a_finished_run_is_not_signalled_and_the_save_goes_through(
        worker, token, declared):
    finished = (queuety.workflow("trig_finished").wait_for_signal("published")
                .dispatch({"token": token}))
    queuety.cancel(finished)
    declare_for(declared, token, "updated", start=None, signal="published",
                run=lambda a: a.run_id)
    article = Article.objects.create(token=token, run_id=finished)

    with transaction.atomic():
        article.title = "after the run"
        article.save()

    assert Article.objects.get(pk=article.pk).title == "after the run"
    assert not Signal.objects.filter(run_id=finished).exists()


def test_signal_with_run__a_run_that_cannot_listen_fails_the_save(token, declared):
    deaf = (queuety.workflow("trig_deaf").wait_for_signal("other").dispatch({"token": token}))
    declare_for(declared, token, "created", start=None, signal="published",
                run=lambda a: a.run_id)

    with pytest.raises(TriggerFailed, match="listens for"), transaction.atomic():
        Article.objects.create(token=token, run_id=deaf)

    assert not Article.objects.filter(token=token).exists()


def test_sqlite__one_run_per_transaction_without_txid_current(tmp_path):
    env = {name: value for name, value in os.environ.items()
           if name not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env.update(QUEUETY_VAR_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="tests.settings",
               PYTHONPATH=str(ROOT))

    done = subprocess.run([sys.executable, "-m", "tests.trigger_sqlite"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)

    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "one_transaction": 1, "a_later_transaction": 2, "inside_rolled_back": 3,
        "after_rollback": 2, "two_autocommit_saves": 4}


# -- with flow control and signal-with-start (queuety.keyed) ---------------------------------

def saves_together(article_pk: int, count: int, threads: int) -> None:
    """``count`` saves of one row, each in its own transaction, from ``threads`` threads
    that start at once (each with its own connection)."""
    barrier = threading.Barrier(threads)

    def saver(indexes):
        try:
            barrier.wait()
            for i in indexes:
                with transaction.atomic():
                    row = Article.objects.get(pk=article_pk)
                    row.title = f"t{i}"
                    row.save()
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(saver, [list(range(t, count, threads)) for t in range(threads)]))


def test_debounce__100_concurrent_saves_of_a_row_start_one_run_with_the_last_payload(
        worker, token, declared):
    article = Article.objects.create(token=token)
    declare_for(declared, token, "updated", start=keyed_steps.plain("trig_debounced"),
                payload=lambda a: {"token": a.token, "title": a.title}, debounce=3)

    saves_together(article.pk, 100, 25)

    [run] = WorkflowRun.objects.filter(name="trig_debounced", state__token=token)
    assert run.key and str(article.pk) in run.key
    folded = list(Event.objects.filter(run_id=run.pk, kind__in=(
        "workflow_started", "debounce_extended")).order_by("pk"))
    assert len(folded) == 100  # every save reached the one pending run
    status = wait_for(run.pk, worker=worker)
    assert status.status == "completed"
    # The last save to commit is the payload the run started with.
    assert status.state["title"] == folded[-1].data["state"]["title"]
    assert status.state["title"] == Article.objects.get(pk=article.pk).title


def test_signal_or_start__a_rows_saves_go_to_one_run_as_signals_in_order(
        worker, token, declared):
    article = Article.objects.create(token=token, title="t0")
    declare_for(declared, token, "updated", start=keyed_steps.inbox("trig_inbox"),
                signal="event", payload=lambda a: {"title": a.title})

    for title in ("t1", "t2", "t3"):
        article.title = title
        article.save()

    [run] = WorkflowRun.objects.filter(name="trig_inbox", key__contains=f":{article.pk}")
    signals = list(Signal.objects.filter(run_id=run.pk, name="event").order_by("pk"))
    assert [s.payload["title"] for s in signals] == ["t1", "t2", "t3"]
    assert all(s.sent_by.startswith("trigger:") for s in signals)
    # The first signal settled the first wait: the run now waits for "close".
    queuety.signal(run.pk, "close")
    assert wait_for(run.pk, worker=worker).status == "completed"


def test_singleton_reject__a_second_save_while_the_run_is_live_fails_that_save(
        worker, token, declared):
    article = Article.objects.create(token=token)
    declare_for(declared, token, "updated", start="reg_keyed_gate", singleton=True)
    article.title = "first"
    article.save()
    [live] = WorkflowRun.objects.filter(name="reg_keyed_gate", key__contains=f":{article.pk}")

    article.title = "second"
    with pytest.raises(TriggerFailed, match="RunConflict"):
        with transaction.atomic():
            article.save()

    assert Article.objects.get(pk=article.pk).title == "first"  # rolled back with the start
    assert WorkflowRun.objects.filter(name="reg_keyed_gate",
                                      key__contains=f":{article.pk}").count() == 1
    queuety.cancel(live.pk)


def test_error__a_caught_trigger_failure_still_rolls_the_transaction_back(token, declared):
    def broken(article):
        raise KeyError("no such field")

    declare_for(declared, token, "created", payload=broken)

    with transaction.atomic():
        try:
            Article.objects.create(token=token)
        except TriggerFailed as error:
            assert "marked for rollback" in str(error) and isinstance(error.__cause__, KeyError)

    assert not Article.objects.filter(token=token).exists()
    assert not WorkflowRun.objects.filter(state__token=token).exists()


def test_error__in_autocommit_the_message_says_the_row_was_committed(token, declared):
    declare_for(declared, token, "created", start="no_such_workflow")

    with pytest.raises(TriggerFailed, match="already committed"):
        Article.objects.create(token=token)

    assert Article.objects.filter(token=token).exists()


def test_signal_or_start__a_save_then_fire_in_one_transaction_sends_one_signal(
        worker, token, declared):
    article = Article.objects.create(token=token, title="t0")
    declare_for(declared, token, "updated", start=keyed_steps.inbox("trig_inbox_once"),
                signal="event", payload=lambda a: {"title": a.title})

    with transaction.atomic():
        article.title = "t1"
        article.save()
        queuety.fire(article, "updated")

    [run] = WorkflowRun.objects.filter(name="trig_inbox_once", key__contains=f":{article.pk}")
    assert Signal.objects.filter(run_id=run.pk, name="event").count() == 1
    queuety.cancel(run.pk)
