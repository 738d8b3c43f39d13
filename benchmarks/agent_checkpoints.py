"""What a checkpoint adds to an agent's model request: the same agent run bare and as a
durable step's attempt (queuety.contrib.pydantic_ai), in one process, on PostgreSQL.

    DATABASE_URL=postgres://.../queuety_x CELERY_BROKER_URL=redis://.../N .venv/bin/python \
        benchmarks/agent_checkpoints.py [--runs 30] [--requests 5] [--rounds 3]

The agent's model is a ``FunctionModel`` that answers at once: it asks for a no-op tool
``--requests - 1`` times, then answers. Each round runs ``--runs`` agent runs three ways,
taking turns run by run (a noisy neighbour hits them alike):

- ``bare``: ``agent.run()``, nothing recorded;
- ``checkpointed``: the same under the durable step's capability, a fresh step row per run,
  every model request and tool call written as it completes (the first attempt's cost);
- ``replayed``: a second attempt of those step rows: every request and tool call answered
  from the checkpoints (a recovered attempt's cost).

Prints the median over rounds of the wall time per model request of each, the added
milliseconds per request (a tool call's checkpoint included: one each per request here), and
the ratio to bare. The database is migrated first (it must be a scratch database).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=30, help="agent runs per mode and round")
    parser.add_argument("--requests", type=int, default=5, help="model requests per run")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if "DATABASE_URL" not in os.environ or not os.environ["DATABASE_URL"].startswith("postgres"):
        sys.exit("Set DATABASE_URL to a scratch PostgreSQL database (it is migrated).")

    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    results = asyncio.run(_measure(args))
    per = {mode: statistics.median(times) * 1000 / (args.runs * args.requests)
           for mode, times in results.items()}
    print(f"| {args.runs} runs x {args.requests} requests, median of {args.rounds} rounds "
          "| ms per request | added ms per request | ratio to bare |")
    print("|---|---:|---:|---:|")
    for mode, ms in per.items():
        print(f"| {mode} | {ms:.3f} | {ms - per['bare']:.3f} | {ms / per['bare']:.2f} |")


async def _measure(args: argparse.Namespace) -> dict[str, list[float]]:
    from asgiref.sync import sync_to_async
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    from queuety.contrib.pydantic_ai.capability import Checkpointing
    from queuety.contrib.pydantic_ai.checkpoints import Journal

    def answer(messages, info):
        asked = sum(isinstance(m, ModelResponse) for m in messages)
        if asked + 1 < args.requests:
            return ModelResponse(parts=[ToolCallPart("noop", {"n": asked},
                                                     tool_call_id=f"c{asked}")])
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(answer, model_name="bench"), name="bench")

    @agent.tool_plain
    def noop(n: int) -> int:
        return n

    rows = await sync_to_async(_step_rows, thread_sensitive=True)(args.runs * args.rounds)
    results: dict[str, list[float]] = {"bare": [], "checkpointed": [], "replayed": []}
    await agent.run("warm up")
    clock = time.perf_counter
    for round_ in range(args.rounds):
        spent = dict.fromkeys(results, 0.0)
        # The modes take turns run by run: the machine's load drifts alike for all three.
        for run_id, step_run_id in rows[round_ * args.runs:(round_ + 1) * args.runs]:
            started = clock()
            await agent.run("go")
            spent["bare"] += clock() - started
            for mode, attempt in (("checkpointed", 1), ("replayed", 2)):
                started = clock()
                journal = await Journal.aload(run_id, step_run_id, 0, "bench", attempt)
                await agent.run("go", capabilities=[Checkpointing(journal)])
                spent[mode] += clock() - started
        for mode, seconds in spent.items():
            results[mode].append(seconds)
    return results


def _step_rows(count: int) -> list[tuple[int, int]]:
    """``count`` runs of a one-step workflow whose step row is processing attempt 1 (nobody
    consumes their queue)."""
    import uuid

    import queuety
    from queuety.models import StepRun

    flow = (queuety.workflow(f"agent_bench_{uuid.uuid4().hex[:8]}")
            .then("benchmarks.agent_checkpoints.noop_step")
            .on_queue(f"qbench-idle-{uuid.uuid4().hex[:6]}"))
    found = []
    for _ in range(count):
        run_id = flow.dispatch({})
        step = StepRun.objects.get(run_id=run_id)
        StepRun.objects.filter(pk=step.pk).update(status="processing", attempt=1)
        found.append((run_id, step.pk))
    return found


def noop_step(state: dict) -> None:
    """The benchmark runs' step (never run: its queue has no worker)."""


if __name__ == "__main__":
    main()
