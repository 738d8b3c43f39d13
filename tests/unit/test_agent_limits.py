"""``QUEUETY["AGENT_LIMITS"]`` (queuety.core.agent_limits, checked by the settings layer), the
replay check of an agent step's journal, and queuety importing without Pydantic AI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from queuety import exceptions
from queuety.conf import settings
from queuety.core import agent_limits
from queuety.core.agent_limits import AgentLimit

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("text", "rate"), [
    ("60/m", (60, 60.0)), ("5/s", (5, 1.0)), ("1000/h", (1000, 3600.0)), ("5/10s", (5, 10.0)),
    (" 2 / d ", (2, 86400.0)), ((3, 1.5), (3, 1.5)), ([10, 60], (10, 60.0)),
])
def test_rates_are_read_as_starts_per_period(text, rate):
    assert agent_limits.parse_rate(text) == rate


@pytest.mark.parametrize("bad", ["60 per minute", "0/m", "5/0s", "/m", "5/w", (0, 1), (1, 0),
                                 (True, 1), 60, None])
def test_a_bad_rate_is_refused_saying_what_to_give(bad):
    with pytest.raises(ValueError, match="'60/m'"):
        agent_limits.parse_rate(bad)


def test_the_most_specific_entry_names_a_models_limit_and_its_group():
    table = agent_limits.check_table({
        "openai:gpt-4o": {"concurrency": 3, "rate_limit": "60/m"},
        "openai:*": {"concurrency": 5}, "*": {"rate_limit": (100, 60)}})
    assert agent_limits.limit_for(table, "openai:gpt-4o") == AgentLimit(
        "agent:openai:gpt-4o", 3, (60, 60.0))
    assert agent_limits.limit_for(table, "openai:gpt-4o-mini") == AgentLimit(
        "agent:openai:gpt-4o-mini", 5, None)
    assert agent_limits.limit_for(table, "anthropic:claude") == AgentLimit(
        "agent:anthropic:claude", None, (100, 60.0))
    ungated = agent_limits.limit_for({}, "function:x")
    assert ungated == AgentLimit("agent:function:x") and not ungated.gated


@pytest.mark.parametrize(("value", "says"), [
    ([], "must be a dict"), ({"": {"concurrency": 1}}, "keys must be model names"),
    ({"openai:gpt-4o": 3}, "'openai:gpt-4o' must be a dict"),
    ({"openai:gpt-4o": {}}, "'openai:gpt-4o' must be a dict"),
    ({"openai:gpt-4o": {"limit": 3}}, "'concurrency'"),
    ({"openai:gpt-4o": {"concurrency": 0}}, "at least 1"),
    ({"openai:gpt-4o": {"concurrency": True}}, "at least 1"),
    ({"*": {"rate_limit": "lots"}}, "rate_limit of '\\*' is wrong"),
])
def test_bad_agent_limits_are_refused_by_the_settings_naming_the_entry(value, says):
    with override_settings(QUEUETY={"AGENT_LIMITS": value}):
        with pytest.raises(ImproperlyConfigured, match=f"AGENT_LIMITS.*{says}"):
            settings.validate()
    settings.reload()


def test_the_issues_agent_limits_are_accepted_and_resolved():
    with override_settings(QUEUETY={"AGENT_LIMITS": {
            "openai:gpt-4o": {"concurrency": 3, "rate_limit": "60/m"},
            "*": {"concurrency": 10}}}):
        settings.reload()
        assert settings.AGENT_LIMITS["openai:gpt-4o"] == AgentLimit(
            "agent:openai:gpt-4o", 3, (60, 60.0))
    settings.reload()


def test_a_replay_that_asks_for_another_tool_fails_naming_run_step_and_checkpoint():
    from queuety.contrib.pydantic_ai.checkpoints import Journal, Recorded, tool_fingerprint

    journal = Journal(41, 7, 0, "research", 2)
    journal.records[("tool", 2, "c2")] = Recorded("search", tool_fingerprint("search", {"q": 1}),
                                                  "found")
    assert journal.replay("tool", 2, "c2", "search", tool_fingerprint("search", {"q": 1})) \
        == "found"
    assert journal.replays["tool"] == 1
    with pytest.raises(exceptions.AgentReplayMismatch,
                       match="Run 41, step 'research'.*checkpoint 2.*different arguments"):
        journal.replay("tool", 2, "c2", "search", tool_fingerprint("search", {"q": 2}))
    with pytest.raises(exceptions.AgentReplayMismatch, match="'search', now to 'fetch'"):
        journal.replay("tool", 2, "c2", "fetch", tool_fingerprint("fetch", {"q": 1}))
    assert journal.replay("model", 3, "", "openai:gpt-4o", "x") is None  # never recorded


def test_a_long_model_name_replays_as_the_checkpoint_stored_it():
    from queuety.contrib.pydantic_ai.checkpoints import NAME_LENGTH, Journal, Recorded

    name = "custom:" + "m" * 400
    journal = Journal(41, 7, 0, "research", 2)
    journal.records[("model", 1, "")] = Recorded(name[:NAME_LENGTH], "f", {"parts": []})
    assert journal.replay("model", 1, "", name, "f") == {"parts": []}


def test_the_rate_ledger_keeps_starts_as_long_as_the_longest_window():
    from queuety.core import agent_limits, resources

    table = agent_limits.check_table({"openai:gpt-4o": {"rate_limit": "1000/d"},
                                      "*": {"rate_limit": "60/m"}})
    assert agent_limits.ledger_horizon([60.0], table) == resources.rate_window(86400.0)
    assert agent_limits.ledger_horizon([7200.0], {}) == resources.rate_window(7200.0)
    assert agent_limits.ledger_horizon([60.0], {}) == 3600.0  # at least an hour


def test_a_model_name_too_long_for_a_group_is_refused_with_the_fix():
    from queuety.core import agent_limits

    long_name = "openai:" + "g" * 300
    with pytest.raises(ValueError, match=r"is 307 characters: at most 249 .*'openai:\*'"):
        agent_limits.check_table({long_name: {"concurrency": 1}})
    table = agent_limits.check_table({"*": {"concurrency": 1}})
    with pytest.raises(ValueError, match="too long.*give the model a shorter name"):
        agent_limits.limit_for(table, long_name)
    assert not agent_limits.limit_for({}, long_name).gated  # no limit, no group to name


def test_a_request_fingerprint_ignores_times_and_tool_return_values():
    from pydantic_ai.messages import ModelRequest, ToolReturnPart, UserPromptPart

    from queuety.contrib.pydantic_ai.checkpoints import request_fingerprint

    def history(returned, prompt="ask", outcome="success"):
        return [ModelRequest(parts=[UserPromptPart(prompt)]),
                ModelRequest(parts=[ToolReturnPart("search", returned, tool_call_id="c1",
                                                   outcome=outcome)])]

    assert request_fingerprint(history({"a": object()})) == request_fingerprint(
        history({"a": "json form"}))
    assert request_fingerprint(history(1)) != request_fingerprint(history(1, prompt="other"))
    # A tool that asked for a retry is not one that returned.
    assert request_fingerprint(history("try again")) != request_fingerprint(
        history("try again", outcome="retried"))


def test_queuety_imports_without_pydantic_ai_and_the_integration_says_what_to_install():
    blocker = ("import sys\n"
               "class Block:\n"
               "    def find_spec(self, name, path=None, target=None):\n"
               "        if name == 'pydantic_ai' or name.startswith('pydantic_ai.'):\n"
               "            raise ImportError('No module named ' + repr(name))\n"
               "sys.meta_path.insert(0, Block())\n"
               "import os, django\n"
               "os.environ['DJANGO_SETTINGS_MODULE'] = 'tests.settings'\n"
               "django.setup()\n"
               "import queuety, queuety.models, queuety.queries, queuety.api.urls\n"
               "try:\n"
               "    import queuety.contrib.pydantic_ai\n"
               "except ImportError as error:\n"
               "    print(error)\n")
    result = subprocess.run([sys.executable, "-c", blocker], cwd=ROOT, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'pip install "queuety-django[pydantic-ai]"' in result.stdout
