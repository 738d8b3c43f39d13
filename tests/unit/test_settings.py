"""QUEUETY settings that cannot work are refused, naming the key and why."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from queuety.conf import settings


@pytest.mark.parametrize("values, message", [
    ({"HEARTBEAT_INTERVAL": 10, "WORKER_LOST_AFTER": 15},
     r"QUEUETY\['WORKER_LOST_AFTER'\] must be at least twice QUEUETY\['HEARTBEAT_INTERVAL'\]"),
    ({"WORKER_LOST_AFTER": 0}, r"QUEUETY\['WORKER_LOST_AFTER'\] must be a positive number"),
    ({"HEARTBEAT_INTERVAL": 60}, r"must be shorter than QUEUETY\['STALE_AFTER'\]"),
    ({"WORKER_LOST_AFTR": 30}, r"Did you mean 'WORKER_LOST_AFTER'"),
    ({"WEBHOOK_RETRY_DELAYS": [10, -1]}, r"QUEUETY\['WEBHOOK_RETRY_DELAYS'\] must be a list of "
                                         r"non-negative numbers"),
    ({"WEBHOOK_RETRY_DELAYS": "10,60"}, r"WEBHOOK_RETRY_DELAYS"),
    ({"WEBHOOK_TIMEOUT": 0}, r"QUEUETY\['WEBHOOK_TIMEOUT'\] must be a positive number"),
    ({"METRICS_TOKEN": "short"}, r"QUEUETY\['METRICS_TOKEN'\] must be None or a string of at "
                                 r"least 16 characters"),
    ({"MAX_ARTIFACT_BYTES": 0}, r"QUEUETY\['MAX_ARTIFACT_BYTES'\] must be a whole number"),
    ({"MAX_CHUNK_BYTES": "64k"}, r"QUEUETY\['MAX_CHUNK_BYTES'\] must be a whole number"),
    ({"CHUNK_BUFFER": True}, r"QUEUETY\['CHUNK_BUFFER'\] must be a whole number"),
    ({"CHUNK_FLUSH_INTERVAL": -1}, r"QUEUETY\['CHUNK_FLUSH_INTERVAL'\] must be a number of "
                                   "seconds from 0"),
    ({"STREAM_POLL_INTERVAL": 0}, r"QUEUETY\['STREAM_POLL_INTERVAL'\] must be a positive"),
    ({"SWEEP_INTERVAL": 0}, r"QUEUETY\['SWEEP_INTERVAL'\] must be a whole number of seconds, "
                            r"at least 1\.$"),
    ({"INLINE_STEPS": 0}, r"QUEUETY\['INLINE_STEPS'\] must be a whole number, at least 1 "),
    ({"SWEEP_LEASE": 0}, r"QUEUETY\['SWEEP_LEASE'\] must be a positive number\.$"),
    ({"LANE_MAX_ABANDONED": True}, r"QUEUETY\['LANE_MAX_ABANDONED'\] must be a whole number, "
                                   r"at least 0"),
    ({"LANE_MAX_CONNECTIONS": 0}, r"QUEUETY\['LANE_MAX_CONNECTIONS'\] must be a whole number, "
                                  r"at least 1"),
    ({"SECRET_KEYS": "password"}, r"QUEUETY\['SECRET_KEYS'\] must be a list of key names"),
    ({"BASE_URL": "https://shop.example.com/app"},
     r"QUEUETY\['BASE_URL'\] must be None or the site's scheme and host, such as "
     r"'https://shop.example.com' \(not 'https://shop.example.com/app'\)"),
    ({"RUN_SCOPE": "tests.workflows.no_such_scope"},
     r"QUEUETY\['RUN_SCOPE'\] names 'tests.workflows.no_such_scope', which cannot be "
     r"imported .*; give the dotted path of a function f\(user, queryset\) -> queryset"),
    ({"RUN_SCOPE": 42}, r"QUEUETY\['RUN_SCOPE'\] must be None, a function f\(user, "
                        r"queryset\) -> queryset, or its dotted path \(got 42\)"),
    ({"RUN_ACCESS": "tests.settings.BUDGET_QUEUE"}, r"QUEUETY\['RUN_ACCESS'\] must be None, a "
                                                  r"function f\(user, run\) -> bool"),
    ({"WEBHOOK_ALLOW_PRIVATE": "yes"}, r"QUEUETY\['WEBHOOK_ALLOW_PRIVATE'\] must be True or "
                                       r"False\."),
    ({"RETENTION": {"default": "30x"}},
     r"QUEUETY\['RETENTION'\]\['default'\] must be a positive duration: \"30d\" \(days\), "
     r"\"12h\" \(hours\), \"90m\" \(minutes\), a datetime.timedelta, or None \(got '30x'\)"),
    ({"RETENTION": {"order": {"done": "7d"}}},
     r"QUEUETY\['RETENTION'\]\['order'\] names 'done', which is not a terminal status; a "
     r"rule may name completed, failed, cancelled"),
    ({"RETENTION": {"order": {"failed": "7w"}}}, r"QUEUETY\['RETENTION'\]\['order'\]\['failed'\]"),
    ({"RETENTION": "30d"}, r"QUEUETY\['RETENTION'\] must be a dict such as"),
    ({"RETENTION": {"default": "30d"}, "RETENTION_DAYS": 30},
     r"QUEUETY\['RETENTION_DAYS'\] and QUEUETY\['RETENTION'\]\['default'\] are both set"),
    ({"ARCHIVE_STORAGE": "archive"},
     r"QUEUETY\['ARCHIVE_STORAGE'\] is 'archive', which is not an alias of the STORAGES "
     r"setting \(it defines 'default', 'staticfiles'\)"),
])
def test_settings__unworkable_values_are_refused(values, message):
    with override_settings(QUEUETY=values), pytest.raises(ImproperlyConfigured, match=message):
        settings.STALE_AFTER  # noqa: B018 - reading a key validates them all


def test_settings__worker_lost_after_defaults_to_two_and_a_half_heartbeats():
    with override_settings(QUEUETY={}):
        assert settings.WORKER_LOST_AFTER == 25.0 == 2.5 * settings.HEARTBEAT_INTERVAL


def test_settings__run_scope_and_run_access_take_a_callable_or_its_dotted_path():
    from tests import workflows

    for given in ("tests.workflows.tenant_scope", workflows.tenant_scope):
        with override_settings(QUEUETY={"RUN_SCOPE": given, "RUN_ACCESS": given}):
            assert settings.RUN_SCOPE is workflows.tenant_scope
            assert settings.RUN_ACCESS is workflows.tenant_scope
    with override_settings(QUEUETY={}):
        assert settings.RUN_SCOPE is None and settings.WEBHOOK_ALLOW_PRIVATE is False
