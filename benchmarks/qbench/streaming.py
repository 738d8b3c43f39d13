"""Chunks per second one streaming step can store (``benchmarks/run --streaming``).

A run of one streaming step (``qbench.steps.stream_tokens``: tokens yielded as fast as the
generator can) is dispatched with publishing captured, then its attempt is executed in this
process by ``queuety.runtime.attempt.execute_step``: the claim, the generator, the chunk
writes and the transition. The figure is chunks / wall time of the attempt, so it includes
everything a worker does. Twice: as shipped (chunks batched by the attempt's writer thread,
``CHUNK_FLUSH_INTERVAL`` 0.05 s) and with ``CHUNK_FLUSH_INTERVAL = 0`` (one guarded INSERT in
autocommit per chunk, durable before the generator resumes). A plain step's attempt is timed
the same way for the fixed cost.

Usage: ``python -m qbench.streaming --chunks 5000`` with DATABASE_URL naming a migrated
database (the driver uses queuety_bench).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def run(chunks: int = 5000, repeats: int = 3) -> dict:
    """Both modes; see :func:`measure`."""
    from django.conf import settings
    from django.test import override_settings

    batched = measure(chunks, repeats)
    with override_settings(QUEUETY={**getattr(settings, "QUEUETY", {}),
                                    "CHUNK_FLUSH_INTERVAL": 0}):
        each = measure(min(chunks, 2000), repeats)
    return {"batched": batched, "per_chunk_insert": each}


def measure(chunks: int, repeats: int) -> dict:
    """Stream ``chunks`` chunks ``repeats`` times; return the per-run rates and their median."""
    import queuety
    from queuety import publish
    from queuety.models import StepChunk, StepRun
    from queuety.runtime.attempt import execute_step

    def attempt_seconds(builder, payload) -> tuple[int, float]:
        with publish.captured():
            run_id = builder.dispatch(payload)
        row = StepRun.objects.get(run_id=run_id)
        started = time.perf_counter()
        execute_step(row.pk, inline=False)
        return run_id, time.perf_counter() - started

    streaming = queuety.workflow("qbench-streaming").then("qbench.steps.stream_tokens")
    plain = queuety.workflow("qbench-plain-step").then("qbench.steps.noop")
    attempt_seconds(streaming, {"n": 10})  # warm caches and the definition row
    rates, per_chunk_ms = [], []
    for _ in range(repeats):
        run_id, seconds = attempt_seconds(streaming, {"n": chunks})
        stored = StepChunk.objects.filter(run_id=run_id).count()
        if stored != chunks or queuety.workflow_status(run_id).state.get("streamed") != chunks:
            raise AssertionError(f"run {run_id}: {stored} of {chunks} chunks stored")
        rates.append(chunks / seconds)
        per_chunk_ms.append(seconds * 1000 / chunks)
    plain_ms = statistics.median(attempt_seconds(plain, {})[1] * 1000 for _ in range(50))
    return {"chunks": chunks, "repeats": repeats,
            "chunks_per_second": [round(r) for r in rates],
            "median_chunks_per_second": round(statistics.median(rates)),
            "median_ms_per_chunk": round(statistics.median(per_chunk_ms), 3),
            "plain_step_attempt_ms": round(plain_ms, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chunks", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import django

    django.setup()
    print(json.dumps(run(args.chunks, args.repeats), indent=1))


if __name__ == "__main__":
    main()
