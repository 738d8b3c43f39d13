"""Steps used by the integration tests; the worker subprocess imports them by dotted path.

Steps leave marks in files under ``$QUEUETY_TEST_DIR`` so a test can count real executions
(side effects), independently of what the engine records.
"""

import os
import time
from pathlib import Path

from django.db.models import Q

import queuety


def marks_dir() -> Path:
    return Path(os.environ["QUEUETY_TEST_DIR"])


def mark(token: str, text: str = "") -> None:
    """Append one line to the mark file ``token`` (O_APPEND: safe across processes)."""
    with open(marks_dir() / token, "a") as handle:
        handle.write(f"{os.getpid()} {text}\n")


def marks(token: str) -> list[str]:
    """Return the lines marked under ``token``."""
    path = marks_dir() / token
    return path.read_text().splitlines() if path.exists() else []


def _append(state, letter):
    mark(f"{state['token']}-{letter}")
    return {"log": state.get("log", []) + [letter], f"done_{letter}": True}


def step_a(state):
    return _append(state, "a")


def step_b(state):
    return _append(state, "b")


def step_c(state):
    return _append(state, "c")


class StepB(queuety.Step):
    """The class form of step_b."""

    def handle(self, state):
        return _append(state, "b")


def jump_to_c(state):
    out = _append(state, "jump")
    out["_next_step"] = "step_c"
    out["_ignored_reserved"] = "never merged"
    return out


def jump_to_nowhere(state):
    return {"_next_step": "no_such_step"}


def boom(state):
    mark(f"{state['token']}-boom")
    raise ValueError(f"boom for order {state.get('order', '?')}")


def slow(state):
    """Sleep ``state['sleep']`` seconds (the duplicate-message test's window)."""
    mark(f"{state['token']}-slow")
    time.sleep(state["sleep"])
    return {"slept": state["sleep"]}


def hang_first_time(state):
    """On the first execution, write the pid and hang (the test kills it); later, finish."""
    token = f"{state['token']}-hang"
    first = not marks(token)
    mark(token, "start")
    if first:
        time.sleep(120)
    return {"hung_once": True}


def interfere(state):
    """Change the run behind the engine's back while this step runs (in-process tests only)."""
    from django.db.models import F

    from queuety.models import StepRun, WorkflowRun
    from queuety.runtime import sweeper

    runs = WorkflowRun.objects.filter(state__token=state["token"])
    action = state["interfere"] if not marks(f"{state['token']}-interfere") else "none"
    if action == "bump_revision":
        runs.update(revision=F("revision") + 1)
    elif action == "cancel":
        runs.update(status="cancelled")
    elif action == "recover":
        from datetime import timedelta

        from django.utils import timezone

        # This attempt's heartbeat thread (every 0.5 s in the tests) may beat between the
        # update and the sweep's look at it: age it again until the sweep has taken it back.
        for _ in range(20):
            held = StepRun.objects.filter(run__in=runs, status="processing")
            if not held.update(heartbeat_at=timezone.now() - timedelta(hours=1)):
                break
            sweeper.sweep()
    mark(f"{state['token']}-interfere")
    return {"interfered": action}


def flaky(state):
    """Raise ``state['raise']`` (a dotted path) on the first ``fail_times`` executions."""
    from queuety.core.imports import import_path

    token = f"{state['token']}-flaky"
    attempt = len(marks(token)) + 1
    mark(token, repr(time.time()))
    if attempt <= state.get("fail_times", 10**9):
        raise import_path(state["raise"])(f"attempt {attempt} of run with token {state['token']}")
    return {"succeeded_on": attempt}


def bad_output(state):
    mark(f"{state['token']}-bad")
    return ["not", "a", "dict"]


def execution_times(token: str, name: str = "flaky") -> list[float]:
    """Return the start times the ``name`` step recorded, in order."""
    return [float(line.split()[1]) for line in marks(f"{token}-{name}")]


def counter_loop(state):
    """Count, and jump back to this same step until the counter reaches 99."""
    mark(f"{state['token']}-loop")
    counter = state.get("counter", 0) + 1
    return {"counter": counter, **({"_next_step": "counter_loop"} if counter < 99 else {})}


class Costly(queuety.Step):
    """Costs 2 units (class attribute) and counts."""

    cost_units = 2

    def handle(self, state):
        mark(f"{state['token']}-costly")
        return {"counter": state.get("counter", 0) + 1}


def fetch_user(state):
    mark(f"{state['token']}-fetch")
    user = state["user_id"]
    return {"user_name": f"User #{user}", "user_email": f"user{user}@example.com",
            "order_count": 42, "order_data": [{"id": 1, "total": 99.5}, {"id": 2, "total": 12}]}


def budget_probe(state, context):
    """A function step that takes the context as its second argument."""
    return {f"probe_{context.step_name}": {
        "run_id": context.run_id, "attempt": context.attempt,
        "cost_left": context.budget.remaining("max_cost_units"),
        "transitions_left": context.budget.remaining("max_transitions"),
        "bytes_left": context.budget.remaining("max_state_bytes"),
    }}


class BudgetProbe(queuety.Step):
    """The class form: reads ``self.context``."""

    def handle(self, state):
        budget = self.context.budget
        return {"probe_class": {"cost_left": budget.remaining("max_cost_units"),
                                "workflow": self.context.workflow}}


def seen_keys(state):
    """Record which keys a step after a wait sees."""
    mark(f"{state['token']}-seen")
    return {"seen": sorted(state)}


def loop_until_three(state):
    """Jump back to the wait named ``gate`` until three rounds were approved."""
    rounds = state.get("rounds", 0) + 1
    return {"rounds": rounds, **({"_next_step": "gate"} if rounds < 3 else {})}


def interfere_then_jump(state):
    """Bump the run's revision (forcing the locked path), then jump over step_b."""
    return {**interfere(state), "_next_step": "step_c"}


def deny_all(user, run):
    """A QUEUETY["RUN_ACCESS"] hook that grants nothing."""
    return False


def tenant_scope(user, runs):
    """A QUEUETY["RUN_SCOPE"] hook: a user's tenant is their last name, a run's is the
    ``tenant`` key of its state (tests/reliability/test_tenants.py)."""
    # A job (a task of Django's tasks framework) carries its tenant as a keyword argument.
    return runs.filter(Q(state__tenant=user.last_name) | Q(state__kwargs__tenant=user.last_name))


def tenant_access(user, run):
    """The same rule as :func:`tenant_scope`, one run at a time (QUEUETY["RUN_ACCESS"])."""
    state = run.state or {}
    return user.last_name in (state.get("tenant"), (state.get("kwargs") or {}).get("tenant"))


def undo(state):
    """A compensation: records the state it was given."""
    import json as _json

    mark(f"{state['token']}-undo", _json.dumps(state.get("log", [])))


class FlakyUndo(queuety.Step):
    """A compensation that fails on its first attempt, with a retry policy of its own."""

    retry = queuety.RetryPolicy(max_attempts=3, initial_delay=0.2, jitter=0)

    def handle(self, state):
        token = f"{state['token']}-flakyundo"
        first = not marks(token)
        mark(token)
        if first:
            raise ConnectionError("compensation backend unavailable")


def broken_undo(state):
    mark(f"{state['token']}-broken")
    raise RuntimeError("this compensation always fails")


def hook(state):
    mark(f"{state['token']}-hook", ",".join(sorted(state)))


def classify(state):
    """A route step: returns the label in the state, or a Route with output."""
    mark(f"{state['token']}-classify")
    label = state["label"]
    if state.get("with_output"):
        return queuety.Route(label, output={"classified_as": label})
    return label


def when_stamp(state):
    """Record when it ran (for delays)."""
    mark(f"{state['token']}-stamp", repr(time.time()))
    return {"stamped": True}


def sleeper(state):
    """A parallel branch that blocks (not cooperatively) for state['nap'] seconds."""
    mark(f"{state['token']}-branch", repr(time.time()))
    time.sleep(state["nap"])
    return {"slept_by": "sleeper", "shared": "first"}


def sleeper_two(state):
    mark(f"{state['token']}-branch", repr(time.time()))
    time.sleep(state["nap"])
    return {"slept_two": True, "shared": "second"}


def plan_tasks(state):
    return {"tasks": state["planned"]}


def run_task(state, item, index):
    """A for_each item: fails when asked to, sleeps when asked to."""
    mark(f"{state['token']}-item", f"{index} {item['id']}")
    if item.get("sleep"):
        time.sleep(item["sleep"])
    if item.get("action") == "fail":
        raise ValueError(f"item {item['id']} failed")
    if item.get("action") == "fail_once" and len(
            [m for m in marks(f"{state['token']}-item") if m.endswith(f" {item['id']}")]) == 1:
        raise ValueError(f"item {item['id']} failed once")
    return {"id": item["id"], "value": index * 10}


def summarise(state, aggregate):
    """A for_each reducer."""
    return {"for_each_count": aggregate["succeeded"],
            "winner_id": aggregate["winner"]["output"]["id"] if aggregate["winner"] else None}


def increment(state):
    mark(f"{state['token']}-inc")
    return {"counter": state.get("counter", 0) + 1}


def poll(state):
    counter = state.get("counter", 0) + 1
    return {"counter": counter, "should_repeat": counter < state["limit"]}


def counter_at_least_3(state):
    """A repeat condition."""
    return state.get("counter", 0) >= 3


def always(state):
    return True


def _occupy(token: str, seconds: float) -> None:
    """Hold one slot for ``seconds``: a shared counter (under a file lock) records how many
    holders there are at once, and the highest number seen."""
    import fcntl
    import json

    def change(delta: int) -> None:
        with open(marks_dir() / f"{token}-slots", "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            handle.seek(0)
            now = json.loads(handle.read() or '{"running": 0, "peak": 0}')
            now["running"] += delta
            now["peak"] = max(now["peak"], now["running"])
            handle.seek(0)
            handle.truncate()
            handle.write(json.dumps(now))

    change(+1)
    try:
        time.sleep(seconds)
    finally:
        change(-1)


def peak_slots(token: str) -> dict:
    import json

    return json.loads((marks_dir() / f"{token}-slots").read_text())


def occupy_item(state, item, index):
    """A for_each item that holds a counted slot for state['nap'] seconds."""
    mark(f"{state['token']}-occupy", f"{index} {time.time()}")
    _occupy(state["token"], state["nap"])
    return {"index": index}


def occupy_branch(state):
    """A parallel branch that holds a counted slot for state['nap'] seconds."""
    mark(f"{state['token']}-occupy", f"branch {time.time()}")
    _occupy(state["token"], state["nap"])
    return {}


def child_work(state):
    """A started child's step: counts, and reports which item it was started for."""
    mark(f"{state['token']}-child", str(state.get("start_item_index")))
    return {"counter": state.get("counter", 0) + 1}


def always_fails(state):
    """Fails every attempt, counting them."""
    mark(f"{state['token']}-fails")
    raise ValueError(f"attempt {len(marks(state['token'] + '-fails'))} failed")
