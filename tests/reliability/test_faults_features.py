"""Faults on what came after ``test_faults.py``: the I/O lane, concurrency groups, rate limits,
streaming steps, schedules and the webhook outbox.

One set of workers serves the module (``features.Pools``): two prefork workers (``a``, with
the embedded beat, hence the sweeper and the schedules; ``b``) consume one queue of the
module's own, and a lane worker (``--pool threads``) a second one, all on the session's
broker. Each test puts its feature under load, SIGKILLs pool processes and a worker's main
process (restarted at once, as a supervisor would, while the others go on) and makes
PostgreSQL drop every connection for 2 s (``chaos.pg_outage``), then checks what the feature
promises. Per fault it measures how long until what the fault hit had moved on, from the
moment of the fault. Test timings (tests/settings.py): no scenario here holds a shipped bound.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from datetime import datetime

import pytest

import queuety
from queuety import schedules
from queuety.models import (
    GroupStart,
    StepChunk,
    StepRun,
    WebhookDelivery,
    WebhookEndpoint,
    WorkflowRun,
)
from queuety.webhooks import signing
from tests import resource_steps, streaming_steps
from tests.integration.conftest import start_together, stop_together
from tests.reliability import steps
from tests.reliability.chaos import PoolWorker, alive
from tests.reliability.features import (
    RETRY,
    SECRET,
    Faults,
    Pools,
    Receiver,
    Sampler,
    completed_once,
    socket_owner,
    wait_finished,
)
from tests.workflows import marks


@pytest.fixture(scope="module")
def hooks(db_session):
    """The webhook receiver (down until its test) and its endpoint, subscribed to
    ``run.failed`` alone: only the webhook test's runs fail, so the other tests send it
    nothing. Made before the workers start, so no process caches "nobody subscribes"."""
    receiver = Receiver()
    endpoint = WebhookEndpoint.objects.create(url=receiver.url, secret=SECRET,
                                              events=["run.failed"])
    yield receiver, endpoint
    receiver.down()
    endpoint.delete()


@pytest.fixture(scope="module")
def pools(quiet_session_worker, hooks, tmp_path_factory):
    handle = Pools(tmp_path_factory.mktemp("features"))
    start_together(*handle.workers)
    yield handle
    stop_together(handle.workers, timeout=10)


# -- the I/O lane ------------------------------------------------------------------------------

def test_lane__killed_and_cut_from_postgres__every_run_completes_each_output_merged_once(
        pools, figures):
    lane = pools.lane
    flow = (queuety.workflow("feat_lane").retry(RETRY)
            .then(steps.lane_fetch, timeout=5, queue=pools.lane_queue)
            .then(steps.lane_parse, timeout=5, queue=pools.lane_queue))
    prefix = uuid.uuid4().hex[:8]
    tokens: list[str] = []
    runs: list[int] = []

    def wave(count: int) -> None:
        for _ in range(count):
            tokens.append(f"{prefix}-{len(tokens)}")
            runs.append(flow.dispatch({"token": tokens[-1], "work": [0.05, 0.2]}))

    faults = Faults(pools)
    started = time.monotonic()
    wave(24)
    # A lane worker has no pool processes: its steps run in threads of the main process.
    for name, action in [("SIGKILL the lane worker's main process, restart it",
                          faults.crash(lane)),
                         ("restart PostgreSQL (connections dropped)", faults.outage())]:
        faults.inject(name, action, runs)
        wave(12)
    wait_finished(runs, 90, pools)
    completed_once(runs, ["lane_fetch", "lane_parse"])
    re_executions = 0
    for token, run in zip(tokens, WorkflowRun.objects.filter(pk__in=runs).order_by("pk")):
        executions: dict[str, set[str]] = {}
        for step, execution, _ in steps.read_ledger(token):
            executions.setdefault(step, set()).add(execution)
        assert run.state["exec_fetch"] in executions["fetch"], (run.pk, executions)
        assert run.state["exec_parse"] in executions["parse"], (run.pk, executions)
        re_executions += sum(len(found) for found in executions.values()) - 2
    figures.record("features_lane", runs=len(runs), faults=faults.rows,
                   handler_re_executions=re_executions,
                   total_s=round(time.monotonic() - started, 1))


# -- concurrency groups and rate limits -------------------------------------------------------

GROUP_LIMIT = 3
RATE = (4, 1.0)


def group_counts(group: str, token: str) -> tuple[int, int, int]:
    """``(recorded, rows, executing)``: the group's running count as Queuety reports it
    (``resource_groups()``' in flight), its processing step rows, and the handlers of
    ``token`` really running (started in the ledger, not ended, their process alive)."""
    recorded = next((g["in_flight"] for g in queuety.resource_groups() if g["group"] == group),
                    0)
    rows = StepRun.objects.filter(concurrency_group=group, status="processing").count()
    return recorded, rows, len(open_starts(token, alive_only=True))


def open_starts(token: str, alive_only: bool) -> list[tuple[float, int]]:
    """``(start, pid)`` of the ledgered handlers of ``token`` that never marked their end."""
    ended = {(round(span[0], 6)) for span in resource_steps.intervals(token)}
    found = [(at, pid) for at, pid, _ in resource_steps.starts(token)
             if round(at, 6) not in ended]
    return [(at, pid) for at, pid in found if not alive_only or alive(pid)]


def wait_counts_true(group: str, token: str, timeout: float = 20) -> float:
    """Seconds until the recorded count, the processing rows and the running handlers agree
    (each is read a few ms apart, so a step just claimed or just ending may part them)."""
    started = time.monotonic()
    seen: list[tuple[int, int, int]] = []
    while len(set(found := group_counts(group, token))) != 1:
        seen.append(found)
        if time.monotonic() - started > timeout:
            raise AssertionError(f"Group {group!r}: recorded, processing rows and running "
                                 f"handlers never agreed within {timeout}s: last {seen[-5:]}")
        time.sleep(0.02)
    return round(time.monotonic() - started, 2)


def test_groups_and_rate_limits__no_slot_leaked_or_double_used_no_window_exceeded(
        pools, figures):
    group, rated = f"fg-{uuid.uuid4().hex[:8]}", f"fr-{uuid.uuid4().hex[:8]}"
    group_token, rate_token = uuid.uuid4().hex[:12], uuid.uuid4().hex[:12]
    limited = (queuety.workflow("feat_group").on_queue(pools.queue).retry(RETRY)
               .then(resource_steps.ledgered, concurrency_group=group,
                     concurrency_limit=GROUP_LIMIT))
    throttled = (queuety.workflow("feat_rate").on_queue(pools.queue).retry(RETRY)
                 .then(resource_steps.ledgered, concurrency_group=rated, rate_limit=RATE))
    runs: list[int] = []
    peaks = {"recorded": 0, "rows": 0}
    over: list[int] = []

    def sample() -> None:
        recorded = next((g["in_flight"] + g["woken"] for g in queuety.resource_groups()
                         if g["group"] == group), 0)
        peaks["recorded"] = max(peaks["recorded"], recorded)
        if recorded > GROUP_LIMIT:
            over.append(recorded)
        peaks["rows"] = max(peaks["rows"], StepRun.objects.filter(
            concurrency_group=group, status="processing").count())

    def wave(count: int) -> None:
        runs.extend(limited.dispatch({"token": group_token, "nap": 0.4})
                    for _ in range(count))
        runs.extend(throttled.dispatch({"token": rate_token, "nap": 0.05})
                    for _ in range(count * 2 // 3))

    faults = Faults(pools)
    sampler = Sampler(sample)
    started = time.monotonic()
    true_after = []
    wave(15)
    sampler.start()
    try:
        for name, action in [
                ("SIGKILL a pool process running a group step (worker a)",
                 faults.kill_pool(pools.a, runs)),
                ("SIGKILL a pool process running a group step (worker b)",
                 faults.kill_pool(pools.b, runs)),
                ("SIGKILL worker b's main process, restart it", faults.crash(pools.b)),
                ("restart PostgreSQL (connections dropped)", faults.outage()),
                ("SIGKILL worker a's main process (with beat), restart it",
                 faults.crash(pools.a))]:
            row = faults.inject(name, action, runs)
            row["group_count_true_after_s"] = wait_counts_true(group, group_token)
            true_after.append(row["group_count_true_after_s"])
            wave(8)
        wait_finished(runs, 120, pools)
    finally:
        sampler.stop()
    assert not over, f"Group {group!r} held more than {GROUP_LIMIT} slots: {over}"
    completed_once(runs, ["ledgered"])
    # Drained: nothing of either group holds a slot, waits or runs.
    assert group_counts(group, group_token) == (0, 0, 0)
    assert not [g for g in queuety.resource_groups() if g["group"] in (group, rated)]
    # No slot used twice: from the handlers' own ledger, a killed one ending when it died.
    unended = open_starts(group_token, alive_only=False)
    assert all(pid in faults.died for _, pid in unended), (unended, faults.died)
    spans = resource_steps.intervals(group_token) + [
        (at, faults.died[pid], "killed") for at, pid in unended]
    assert resource_steps.peak(spans) <= GROUP_LIMIT, spans
    # The rate limit, across the kills: the starts Queuety recorded, in any window; and no
    # execution started unrecorded (a killed attempt's start counts, as its retry's does).
    admitted = [at.timestamp() for at in GroupStart.objects.filter(group=rated)
                .values_list("started_at", flat=True)]
    assert resource_steps.max_in_window(admitted, RATE[1]) <= RATE[0], sorted(admitted)
    assert len(resource_steps.starts(rate_token)) <= len(admitted)
    figures.record("features_groups_rates", runs=len(runs), faults=faults.rows,
                   group_limit=GROUP_LIMIT, peak_recorded=peaks["recorded"],
                   peak_processing_rows=peaks["rows"], peak_running_handlers=resource_steps.peak(
                       spans), rate_limit=list(RATE),
                   max_starts_in_window=resource_steps.max_in_window(admitted, RATE[1]),
                   rate_starts=len(admitted), samples_skipped=sampler.skipped,
                   total_s=round(time.monotonic() - started, 1))


# -- streaming steps ---------------------------------------------------------------------------

STREAM_CHUNKS = 30


class Followers:
    """Readers that follow each run's stream while it is written (``queuety.chunks`` after
    the last index each has), as a client of the REST endpoint or the SSE stream does."""

    def __init__(self) -> None:
        self.read: dict[int, list[tuple[int, str, int]]] = {}
        self.done: set[int] = set()

    def follow(self, run_id: int) -> None:
        self.read.setdefault(run_id, [])

    def sample(self) -> None:
        for run_id, got in list(self.read.items()):
            if run_id in self.done:
                continue
            page = queuety.chunks(run_id, "Tokens", after=got[-1][0] if got else -1)
            got.extend((c["index"], c["content"], c["attempt"]) for c in page.chunks)
            if page.finished:
                self.done.add(run_id)


def check_stream(run_id: int, token: str, followed: list[tuple[int, str, int]]) -> int:
    """The run's chunks, stored, served and followed, are t0 .. t29 once each in order, each
    attempt's from where its predecessor's stored ones ended; return the attempts it took."""
    expected = [f"t{i} " for i in range(STREAM_CHUNKS)]
    stored = list(StepChunk.objects.filter(run_id=run_id).order_by("index")
                  .values_list("index", "content", "attempt"))
    assert [index for index, _, _ in stored] == list(range(STREAM_CHUNKS)), (run_id, stored)
    assert [json.loads(text) for _, text, _ in stored] == expected
    attempts = [attempt for _, _, attempt in stored]
    assert attempts == sorted(attempts), (run_id, stored)
    # "<attempt>:<chunks it found stored>" as each attempt began.
    resumed = dict(line.split()[1].split(":") for line in marks(f"{token}-resume"))
    for attempt in set(attempts):
        assert attempts.index(attempt) == int(resumed[str(attempt)]), (run_id, resumed, stored)
    served = queuety.chunks(run_id, "Tokens")
    assert served.finished and [(c["index"], c["content"], c["attempt"])
                                for c in served.chunks] == [
        (index, json.loads(text), attempt) for index, text, attempt in stored]
    assert followed == [(c["index"], c["content"], c["attempt"]) for c in served.chunks]
    state = WorkflowRun.objects.get(pk=run_id).state
    assert (state["text"], state["count"]) == ("".join(expected), STREAM_CHUNKS)
    return len(resumed)


def test_streaming__killed_mid_stream__chunks_stored_and_served_once_each_in_order(
        pools, figures):
    flow = (queuety.workflow("feat_stream").on_queue(pools.queue)
            .then(streaming_steps.Tokens, retry=RETRY))
    prefix = uuid.uuid4().hex[:8]
    tokens: dict[int, str] = {}
    followers = Followers()

    def wave(count: int) -> None:
        for _ in range(count):
            token = f"{prefix}-{len(tokens)}"
            run_id = flow.dispatch({"token": token, "n": STREAM_CHUNKS, "pause": 0.03})
            tokens[run_id] = token
            followers.follow(run_id)

    faults = Faults(pools)
    sampler = Sampler(followers.sample)
    started = time.monotonic()
    wave(10)
    sampler.start()
    try:
        for name, action in [
                ("SIGKILL a pool process mid-stream (worker a)",
                 faults.kill_pool(pools.a, list(tokens))),
                ("SIGKILL a pool process mid-stream (worker b)",
                 faults.kill_pool(pools.b, list(tokens))),
                ("restart PostgreSQL (connections dropped)", faults.outage()),
                ("SIGKILL worker b's main process mid-stream, restart it",
                 faults.crash(pools.b))]:
            faults.inject(name, action, list(tokens))
            wave(5)
        wait_finished(list(tokens), 90, pools)
        deadline = time.monotonic() + 10
        while len(followers.done) < len(tokens) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        sampler.stop()
    completed_once(list(tokens), ["Tokens"])
    attempts = Counter(check_stream(run_id, token, followers.read[run_id])
                       for run_id, token in tokens.items())
    assert sum(n for taken, n in attempts.items() if taken > 1) >= 1  # a kill hit a stream
    figures.record("features_streaming", runs=len(tokens), faults=faults.rows,
                   runs_by_attempts=dict(attempts), samples_skipped=sampler.skipped,
                   total_s=round(time.monotonic() - started, 1))


# -- schedules ---------------------------------------------------------------------------------

def beat_sends(worker: PoolWorker, name: str) -> list[float]:
    """When beat sent schedule ``name``'s fires (epoch seconds), from every log of ``worker``."""
    sent = []
    for path in sorted(worker.log_dir.glob(f"worker-{worker.name}-*.log")):
        for line in path.read_text().splitlines():
            if f"Sending due task {schedules.TASK_PREFIX}{name} " in line:
                stamp = line[1:].split(": ", 1)[0]
                sent.append(datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return sorted(sent)


def fires_lost_with_a_crash(workers: list[PoolWorker]) -> list[str]:
    """Fire messages (task ids) that a worker reserved and never ran, all in the log of a
    start of it whose main process was SIGKILLed (each start logs to a file of its own)."""
    logs = {path: path.read_text() for worker in workers
            for path in sorted(worker.log_dir.glob(f"worker-{worker.name}-*.log"))}
    finals = [f"worker-{worker.name}-{worker.starts}.log" for worker in workers]
    received = {line.split("[", 2)[2].split("]")[0]: path for path, text in logs.items()
                for line in text.splitlines()
                if f"Task {schedules.FIRE_TASK}[" in line and line.endswith("] received")}
    return [task for task, path in received.items() if path.name not in finals and not any(
        f"{schedules.FIRE_TASK}[{task}] succeeded" in text for text in logs.values())]


def tick_runs(name: str) -> Counter:
    """Runs schedule ``name`` started, by their tick (epoch seconds)."""
    prefix = schedules.key_prefix(name)
    return Counter(datetime.fromisoformat(key.removeprefix(prefix)).timestamp()
                   for key in WorkflowRun.objects.filter(idempotency_key__startswith=prefix)
                   .values_list("idempotency_key", flat=True))


def test_schedules__beat_and_workers_killed__each_tick_sent_starts_one_run(pools, figures):
    name, token = f"feat-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex[:12]
    down = {}
    faults = Faults(pools)

    def crash_beat():
        detail = faults.crash(pools.a, down=3.0)()
        down["from"] = time.time()  # beat, a child of the main process, dies with its orphans
        return detail

    plan = [("SIGKILL a pool process of worker a", faults.kill_pool(pools.a)),
            ("SIGKILL worker a's main process (with beat), down 3 s, restart it", crash_beat),
            ("restart PostgreSQL (connections dropped)", faults.outage()),
            ("SIGKILL worker b's main process, restart it", faults.crash(pools.b))]
    started = time.monotonic()
    queuety.schedule(name, workflow="reg_letters", every=1, payload={"token": token})
    try:
        deadline = time.monotonic() + 30
        while len(tick_runs(name)) < 2:
            assert time.monotonic() < deadline, "The schedule never fired." + pools.tails()
            time.sleep(0.2)
        for fault, action in plan:
            before = time.time()
            detail = action()
            after = time.time()
            while not any(tick >= int(after) + 1 for tick in tick_runs(name)):
                assert time.time() - after < 30, f"No tick fired after {fault!r}." + \
                    pools.tails()
                time.sleep(0.1)
            faults.rows.append({"fault": fault, "detail": detail,
                                "fault_s": round(after - before, 2),
                                "next_tick_run_s": round(time.time() - before, 2)})
            faults.settle()
            time.sleep(1.5)
    finally:
        schedules.remove(name)
    down["to"] = faults.back["a"]
    time.sleep(1.5)  # a fire sent just before the removal still runs
    runs = list(WorkflowRun.objects.filter(idempotency_key__startswith=schedules.key_prefix(
        name)).values_list("pk", flat=True))
    wait_finished(runs, 60, pools)
    completed_once(runs, ["step_a", "step_b", "step_c"])
    ticks = tick_runs(name)
    assert set(ticks.values()) == {1}, ticks  # no tick started two runs
    sent = beat_sends(pools.a, name)
    # Each fire beat sent started its tick's run (a send within 50 ms of a second's boundary
    # may be stamped on either side of it), and no run came from anywhere else.
    # The exception: a fire a worker had reserved (its try again after the outage, held for
    # its countdown) when its main process was SIGKILLed; Redis gives it out again only after
    # its visibility timeout, an hour (docs/reliability.md).
    unmatched = [at for at in sent if not {int(at - 0.05), int(at + 0.05)} & set(ticks)]
    lost = fires_lost_with_a_crash([pools.a, pools.b])
    assert len(unmatched) <= len(lost), (unmatched, lost, sorted(ticks))
    assert len(ticks) <= len(sent)
    # While beat was down nothing fired, and nothing was made up for afterwards: the ticks it
    # missed are skipped (django-celery-beat's interval: the next fire is due a period after
    # the last one it sent; on its return it fires once, for the present tick).
    resumed = min(at for at in sent if at > down["to"])  # beat's first fire once back
    missed = [tick for tick in range(int(down["from"]) + 1, int(resumed))]
    assert not set(missed) & set(ticks), (missed, sorted(ticks))
    first, last = min(ticks), max(ticks)
    gaps = [tick for tick in range(int(first), int(last) + 1) if tick not in ticks]
    figures.record("features_schedules", faults=faults.rows, ticks=len(ticks),
                   fires_sent=len(sent), ticks_skipped_while_beat_down=len(missed),
                   beat_down_s=round(resumed - down["from"], 2),
                   fires_lost_with_a_crashed_worker=len(unmatched),
                   other_ticks_without_a_run=len(set(gaps) - set(missed)),
                   total_s=round(time.monotonic() - started, 1))


# -- the webhook outbox ------------------------------------------------------------------------

def check_deliveries(delivered: list[WebhookDelivery], receiver: Receiver,
                     hit: Counter) -> dict[str, list[dict]]:
    """Each delivery reached the receiver as one event, signed, at most once more than the
    faults that hit it in flight, and its outbox row says delivered; return the receipts of
    each event id."""
    received: dict[str, list[dict]] = {}
    for seen in receiver.seen:
        received.setdefault(seen["id"], []).append(seen)
    for row in delivered:
        got = received.get(str(row.event_id), [])
        assert got, f"Delivery {row.pk} ({row.event_id}) never reached the receiver."
        assert len({seen["body"] for seen in got}) == 1  # each attempt the same event
        body = json.loads(got[0]["body"])
        assert (body["id"], body["type"], body["data"]["run_id"]) == (
            str(row.event_id), "run.failed", row.run_id)
        for seen in got:
            signing.verify(seen["body"], seen["signature"], SECRET)
        # At least once: a second receipt only where a fault hit the delivery in flight.
        assert len(got) <= 1 + hit[str(row.event_id)], (row.pk, len(got), hit)
        assert (row.status, row.last_status_code) == (WebhookDelivery.DELIVERED, 200)
        assert row.delivered_at is not None and row.attempts >= len(got)
    held = [seen["id"] for seen in receiver.seen if seen["held"]]
    assert all(len(received[event]) == 2 for event in held)  # killed mid-send: sent again
    return received


def test_webhooks__receiver_down_then_back_sender_killed_mid_delivery__each_delivered_once(
        pools, hooks, figures):
    receiver, endpoint = hooks
    flow = queuety.workflow("feat_hook").on_queue(pools.queue).then(steps.refuse)
    token = uuid.uuid4().hex[:12]
    runs: list[int] = []
    hit: Counter = Counter()
    """How many faults hit each delivery (event id) while it was being sent."""
    faults = Faults(pools)

    def rows():
        return WebhookDelivery.objects.filter(endpoint=endpoint, run_id__in=runs)

    def sending() -> set[str]:
        return {str(event) for event in rows().filter(status=WebhookDelivery.SENDING)
                .values_list("event_id", flat=True)}

    def fault(name: str, action) -> None:
        in_flight, begun = sending(), time.monotonic()
        detail, held = action()
        in_flight |= held
        hit.update(in_flight)
        while rows().filter(event_id__in=in_flight).exclude(
                status=WebhookDelivery.DELIVERED).exists():
            assert time.monotonic() - begun < 60, f"{name}: {in_flight} never delivered." \
                + pools.tails()
            time.sleep(0.1)
        faults.rows.append({"fault": name, "detail": detail, "in_flight": len(in_flight),
                            "delivered_s": round(time.monotonic() - begun, 2)})
        faults.settle()

    def mid_delivery(crash: bool):
        """Hold the next request open; SIGKILL the pool process sending it, or the main
        process of its worker (restarted)."""
        def action():
            receiver.hold.set()
            held = receiver.held.get(timeout=30)
            workers = {pid: w for w in (pools.a, pools.b) for pid in w.children()}
            pid = socket_owner(held["peer"], list(workers))
            if crash:
                detail = faults.crash(workers[pid])()
            else:
                detail = faults.kill_pool(workers[pid], pid=pid)()
            return f"{detail}, holding delivery {held['id']}", {held["id"]}
        return action

    def dispatch(count: int) -> None:
        runs.extend(flow.dispatch({"token": token}) for _ in range(count))

    started = time.monotonic()
    dispatch(20)
    while rows().filter(attempts__gte=1).count() < 20:
        assert time.monotonic() - started < 60, "The deliveries were never attempted."
        time.sleep(0.1)
    time.sleep(2.0)  # refused and retried, the receiver being down
    back = time.monotonic()
    receiver.up()
    fault("SIGKILL the pool process mid-delivery (receiver back)", mid_delivery(crash=False))
    dispatch(15)
    fault("restart PostgreSQL (connections dropped)", lambda: (Faults.outage()(), set()))
    dispatch(15)
    fault("SIGKILL the main process of the worker mid-delivery, restart it",
          mid_delivery(crash=True))
    while rows().exclude(status=WebhookDelivery.DELIVERED).exists() or len(rows()) < len(runs):
        assert time.monotonic() - back < 90, list(rows().exclude(
            status=WebhookDelivery.DELIVERED).values_list("pk", "status", "attempts"))
        time.sleep(0.2)
    all_delivered_s = round(time.monotonic() - back, 2)
    wait_finished(runs, 30, pools)
    delivered = list(rows())
    assert len(delivered) == len(runs)  # one run.failed each
    received = check_deliveries(delivered, receiver, hit)
    figures.record("features_webhooks", deliveries=len(delivered), faults=faults.rows,
                   received_twice=sum(len(got) > 1 for got in received.values()),
                   hit_in_flight=len(hit), receiver_down_s=round(back - started, 1),
                   all_delivered_after_back_s=all_delivered_s,
                   total_s=round(time.monotonic() - started, 1))
