"""Routing: one model name over three simulated providers, hedged on the live P95 TTFT.

"fast" answers in about 150 ms but stalls for a second on one request in five, "steady" takes
about 300 ms, "slow" 600 ms. They are providers of kind "simulator": the client starts each on
127.0.0.1 and stops it when it closes. No API keys, nothing leaves 127.0.0.1.
"""

import asyncio

from llmroute import AsyncOpenAI

CONFIG = {
    "providers": {
        "fast": {
            "kind": "simulator",
            "profile": {
                "ttft_median": "150ms",
                "ttft_sigma": 0.2,
                "stall_prob": 0.2,
                "stall_range": ["1s", "1s"],
            },
        },
        "steady": {"kind": "simulator", "profile": {"ttft_median": "300ms", "ttft_sigma": 0.1}},
        "slow": {"kind": "simulator", "profile": {"ttft_median": "600ms"}},
    },
    "models": {
        "chat": {
            "targets": ["fast:sim-small", "steady:sim-small", "slow:sim-small"],
            "policy": "hedge",  # start the best; hedge on the next best at its live p95
            "hedge_after": "p95",
        }
    },
}


async def main() -> None:
    async with AsyncOpenAI(config=CONFIG) as client:
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
    asyncio.run(main())
