"""Client CPU per request: 1-token streamed chat calls to a zero-latency simulator.

Where ``overhead.py`` measures the cost per chunk of long answers, this measures what every
request costs before and after its chunks (building, sending, the response wrapper, the stream's
setup): 100 calls per round, the median of ``--rounds`` rounds of ``time.process_time()``. The
simulator runs in its own process, so only the client's CPU counts. Compare two trees by running
this from each (e.g. the old one from a ``git worktree`` with ``PYTHONPATH`` pointing at it),
alternated, on the same machine.

    .venv/bin/python benchmarks/per_request.py --rounds 7
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import llmroute
from llmroute.testing import Profile, SimulatorProcess

MESSAGES = [{"role": "user", "content": "hi"}]


async def main(rounds: int, calls: int) -> None:
    with SimulatorProcess(profile=Profile(reply_tokens=1), tls=True) as sim:
        client = llmroute.AsyncOpenAI(api_key="k", base_url=sim.base_url, verify=sim.ssl_context())
        for _ in range(20):  # warm: connection, imports, caches
            await client.chat.completions.create(model="m", messages=MESSAGES)
        per_call: list[float] = []
        for _ in range(rounds):
            started = time.process_time()
            for _ in range(calls):
                stream = await client.chat.completions.create(
                    model="m", messages=MESSAGES, stream=True
                )
                async for _ in stream:
                    pass
            per_call.append((time.process_time() - started) / calls * 1e3)
        await client.close()
    print(
        f"client CPU per 1-token streamed request: median {statistics.median(per_call):.3f} ms "
        f"(min {min(per_call):.3f}, max {max(per_call):.3f}) over {rounds} rounds of {calls}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.calls))
