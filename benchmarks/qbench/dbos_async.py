"""DBOS peer of the I/O workload: N async workflows, each awaiting an async 1 s step, in one
process; prints one JSON line (wall seconds, peak RSS). Usage: python -m qbench.dbos_async --n 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time

from dbos import DBOS

from qbench import env


@DBOS.step()
async def wait_one(i: int) -> int:
    await asyncio.sleep(1.0)
    return i


@DBOS.workflow()
async def io_workflow(i: int) -> int:
    return await wait_one(i)


async def run(n: int) -> float:
    started = time.monotonic()
    await asyncio.gather(*(io_workflow(i) for i in range(n)))
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200)
    args = parser.parse_args()
    DBOS(config={"name": "qbench_io", "system_database_url":
                 env.pg_url(env.DBOS_DB, "postgresql")})
    DBOS.launch()
    seconds = asyncio.run(run(args.n))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(json.dumps({"seconds": seconds, "peak_rss_mib": peak / 1024}))
    DBOS.destroy()


if __name__ == "__main__":
    main()
