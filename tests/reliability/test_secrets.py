"""Secrets: no state, payload or token in logs at INFO or above, and the admin (and the
approval-link page) mask the keys a site marks secret (``QUEUETY["SECRET_KEYS"]``)."""

from __future__ import annotations

import json
import logging
import re
import uuid

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings

import queuety
from queuety import approvals
from queuety.masking import MASK
from tests import workflows
from tests.integration.conftest import wait_for
from tests.settings import QUEUETY as TEST_QUEUETY

SECRET_SETTINGS = {**TEST_QUEUETY, "SECRET_KEYS": ["api_key", "Card_Number"]}


@pytest.fixture
def superuser():
    user = User.objects.create_superuser(f"root{uuid.uuid4().hex[:8]}", password="pw")
    client = Client()
    client.force_login(user)
    return client


def test_logs__no_state_payload_or_token_at_info_or_above(worker, token, caplog):
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    worker_log_start = len(worker.log())
    caplog.set_level(logging.INFO)

    run_id = (queuety.workflow("rel_secret_logs").then(workflows.step_a)
              .wait_for_signal("card").wait_for_decision().then(workflows.boom)
              .dispatch({"token": token, "api_key": secret, "order": secret}))
    wait_for(run_id, statuses=("waiting_for_signal",), worker=worker)
    queuety.signal(run_id, "card", {"card_number": secret})
    wait_for(run_id, statuses=("waiting_for_signal",), worker=worker)
    link = approvals.approval_link(run_id)
    link_token = link.rstrip("/").rsplit("/", 1)[1]
    assert Client().post(link, {"action": "approve", "note": secret}).status_code == 200
    # A reused, a forged and an unknown link: each answer is logged, without the token.
    assert Client().get(link).status_code == 410
    assert Client().get(link[:-3] + "xx/").status_code == 403
    status = wait_for(run_id, worker=worker)
    assert status.status == "failed"  # boom, whose message names the order: see below

    records = [r for r in caplog.records if r.levelno >= logging.INFO]
    here = "\n".join(r.getMessage() for r in records)
    there = "\n".join(line for line in worker.log()[worker_log_start:].splitlines()
                      if re.search(r": (INFO|WARNING|ERROR|CRITICAL)/", line))
    assert records and there  # both logs were written to
    assert link_token not in here and link_token not in there
    # The state and payloads never appear; only the step's own exception message does (the
    # boom step puts state["order"] in it, so that case is excluded from the check).
    here_without_error = here.replace(f"boom for order {secret}", "")
    there_without_error = there.replace(f"boom for order {secret}", "")
    assert secret not in here_without_error
    assert secret not in there_without_error


def test_admin__masks_secret_keys_in_state_timeline_signals_and_exports(superuser, worker,
                                                                       token):
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    run_id = (queuety.workflow("rel_secret_admin").wait_for_signal("card")
              .wait_for_approval().dispatch({"token": token, "api_key": secret,
                                             "nested": [{"API_KEY": secret}]}))
    queuety.signal(run_id, "card", {"card_number": secret, "last4": "4242"})
    wait_for(run_id, statuses=("waiting_for_signal",), worker=worker)
    pages = {
        "run page": f"/admin/queuety/workflowrun/{run_id}/change/",
        "whole state": f"/admin/queuety/workflowrun/{run_id}/change/?state=all",
        "export": f"/admin/queuety/workflowrun/{run_id}/export/",
    }

    with override_settings(QUEUETY=SECRET_SETTINGS):
        shown = {name: superuser.get(path) for name, path in pages.items()}
        # The approvals page lists the oldest waits first, 50 a page: find this run's page.
        for page in range(1, 200):
            listed = superuser.get(f"/admin/queuety/workflowrun/approvals/?page={page}")
            if f"/workflowrun/{run_id}/change/" in listed.content.decode():
                shown["approvals"] = listed
                break
        public = Client().get(approvals.approval_link(run_id))
        document = json.loads(shown["export"].content)
    unmasked = superuser.get(pages["export"])

    assert "approvals" in shown, "the run is on no page of the approvals list"
    for name, response in {**shown, "approval page": public}.items():
        assert response.status_code == 200, name
        body = response.content.decode()
        assert secret not in body, name
        assert MASK in body, name
    assert "4242" in shown["run page"].content.decode()  # other keys stay readable
    assert document["run"]["state"]["api_key"] == MASK
    assert document["run"]["state"]["card_number"] == MASK
    # The stored data, and everything without SECRET_KEYS, keep the real values.
    assert queuety.workflow_status(run_id).state["api_key"] == secret
    assert secret in unmasked.content.decode()


def test_secret_keys__must_be_a_list_of_names():
    from django.core.exceptions import ImproperlyConfigured

    from queuety.conf import settings

    with override_settings(QUEUETY={**TEST_QUEUETY, "SECRET_KEYS": "api_key"}):
        with pytest.raises(ImproperlyConfigured, match="list of key names"):
            assert settings.SECRET_KEYS is None  # never reached: reading raises
