"""Routing: one model name over three simulated providers, hedged on the live P95 TTFT.

"fast" answers in about 150 ms but stalls for a second on one request in five, "steady" takes
about 300 ms, "slow" 600 ms. No API keys, nothing leaves 127.0.0.1.
"""

import asyncio

from llmroute import AsyncOpenAI
from llmroute.testing import Profile, Simulator

PROFILES = {
    "fast": Profile(ttft_median=0.15, ttft_sigma=0.2, stall_prob=0.2, stall_range=(1.0, 1.0)),
    "steady": Profile(ttft_median=0.3, ttft_sigma=0.1),
    "slow": Profile(ttft_median=0.6),
}


async def main(sims: dict[str, Simulator]) -> None:
    config = {
        "providers": {
            name: {"base_url": sim.base_url, "api_key": "sim", "continuation": {}}
            for name, sim in sims.items()
        },
        "models": {
            "chat": {
                "targets": [f"{name}:sim-small" for name in sims],
                "policy": "hedge",  # start the best; hedge on the next best at its live p95
                "hedge_after": "p95",
            }
        },
    }
    verify = next(iter(sims.values())).ssl_context()  # the simulators' test CA
    async with AsyncOpenAI(config=config, verify=verify) as client:
        await client.warmup()
        for i in range(12):
            stream = await client.chat.completions.create(
                model="chat",
                messages=[{"role": "user", "content": f"Question {i}"}],
                stream=True,
            )
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            route = stream.route
            assert route is not None and route.ttft is not None
            tried = ", ".join(f"{a.target.split(':')[0]} {a.outcome}" for a in route.attempts)
            print(f"{i:2} first token {route.ttft * 1000:4.0f} ms  [{tried}]  {text[:32]}...")
        print("\nlive stats (TTFT p50 / p95 over the window):")
        for name, stats in client.stats().items():
            if stats.ttft_p50 is not None and stats.ttft_p95 is not None:
                p50, p95 = stats.ttft_p50 * 1000, stats.ttft_p95 * 1000
                print(f"  {name:16} n={stats.n:2}  p50 {p50:4.0f} ms  p95 {p95:5.0f} ms")
            else:
                print(f"  {name:16} n={stats.n:2}")


if __name__ == "__main__":
    started = [Simulator(profile=profile).start() for profile in PROFILES.values()]
    try:
        asyncio.run(main(dict(zip(PROFILES, started, strict=True))))
    finally:
        for sim in started:
            sim.stop()
